"""Full (softmax) attention layer: llama / qwen2 (qkv bias) / qwen3 (q/k norm) / qwen3_5 (gated output, partial rotary)."""

from __future__ import annotations

import torch
from torch import nn

from treeflash.kv.attention_cache import AttentionCache
from treeflash.models.config import ModelConfig
from treeflash.models.layers import RMSNorm, apply_rotary
from treeflash.models.step import StepInput


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.gated = config.attn_output_gate
        q_out = config.num_heads * d * (2 if self.gated else 1)
        self.q_proj = nn.Linear(h, q_out, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps, config.norm_unit_offset)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, config.norm_unit_offset)
        else:
            self.q_norm = self.k_norm = None
        self.scale = d**-0.5

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [T, rotary_dim]
        step: StepInput,
        cache: AttentionCache,
    ) -> torch.Tensor:  # [T, hidden]
        n = x.shape[0]
        q = self.q_proj(x)
        gate = None
        if self.gated:
            q, gate = q.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(n, -1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if step.key_mask is not None:
            out = cache.attend_static(q, k, v, step.slots, step.key_mask, self.scale).reshape(n, -1)
        else:
            out = cache.attend(q, k, v, step.start, step.tree_mask, self.scale).reshape(n, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)
