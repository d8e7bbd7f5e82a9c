"""Full (softmax) attention layer: llama / qwen2 (qkv bias) / qwen3 (q/k norm) / qwen3_5 (gated output, partial rotary)."""

from __future__ import annotations

import torch
from torch import nn

from treeflash.kernels.pointwise.activation import sigmoid_gate
from treeflash.kernels.pointwise.norm import scale_rows
from treeflash.kernels.pointwise.rotary import norm_rotary
from treeflash.kernels.linear import gemv, projection
from treeflash.kv.attention_cache import AttentionCache
from treeflash.models.config import ModelConfig
from treeflash.models.layers import RMSNorm, fuse_linears, fuse_packed_runs, packed_outputs
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
        self.eps, self.unit_offset = config.rms_norm_eps, config.norm_unit_offset
        self.register_buffer("qkv_weight", None, persistent=False)  # [q_out + 2 * kv_out, hidden] once fused
        self.register_buffer("qkv_bias", None, persistent=False)
        self.register_buffer("qkv_folded", None, persistent=False)  # [q_out + 2 * kv_out, hidden]: fold_norm
        self.qkv_packed = None  # q, k and v fused: one Int4Linear (models.int4_linear), or PackedRuns of QuantLinear
        self.gemv_tables = gemv.TUNED  # which one-row projections take the GEMVs (CausalLM.fuse_projections)

    def fuse(self) -> None:
        """One GEMV for q, k and v: the three weights (and biases) become views of one tensor."""
        if self.qkv_weight is not None or self.qkv_packed is not None:
            return
        lins = [self.q_proj, self.k_proj, self.v_proj]
        if all(type(lin) is nn.Linear for lin in lins):  # registered buffers: .to() carries them
            self.qkv_weight, self.qkv_bias = fuse_linears(lins)
        else:
            self.qkv_packed = fuse_packed_runs(lins)

    def fold_norm(self, norm: RMSNorm) -> None:
        """qkv_folded = the fused q/k/v weight with the input norm's scale folded into its columns, for
        forward_folded (the raw residual stream in, 1 / rms applied after the projection). Needs
        fuse(), no q/k/v bias and no output gate."""
        self.qkv_folded = norm.fold_into(self.qkv_weight, self.qkv_folded)

    def forward_folded(self, s: torch.Tensor, rope, step: StepInput, cache: AttentionCache, norm_eps: float) -> torch.Tensor:
        """s [T, hidden], the residual stream -> s + o_proj(attention(norm(s))), s updated in place: the
        projection reads s itself (qkv_folded), the rotary kernel applies 1 / rms(s), and o_proj adds
        into s in its GEMM (beta = 1). Two launches fewer than norm + projection + add."""
        n = s.shape[0]
        q, k, v = projection.folded(s, self.qkv_folded, tables=self.gemv_tables).split(
            [self.q_proj.weight.shape[0], self.k_proj.weight.shape[0], self.v_proj.weight.shape[0]], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = self._attend(q, k, v, rope, step, cache, rows=(s, norm_eps))
        return projection.folded(out, self.o_proj.weight, add_into=s, tables=self.gemv_tables)

    def _attend(self, q, k, v, rope, step: StepInput, cache: AttentionCache, rows=None) -> torch.Tensor:
        """q [T, H, D], k, v [T, Hkv, D] before qk-norm and rotary -> attention output [T, H * D]; the
        new keys and values go into the cache. rows: None, or (stream, eps) for the folded input
        norm (q, k and v first times 1 / rms of the stream's row)."""
        n = q.shape[0]
        cos, sin = rope
        q_w = self.q_norm.weight if self.q_norm is not None else None
        k_w = self.k_norm.weight if self.k_norm is not None else None
        if step.key_mask is not None and hasattr(cache, "attend_static_rotary"):  # dense cache: one kernel turns and writes
            rotary = (cos, sin, q_w, k_w, self.eps, self.unit_offset)
            return cache.attend_static_rotary(q, k, v, rotary, step.slots, step.key_mask, self.scale, rows).reshape(n, -1)
        if rows is not None:  # the folded norm's scale in torch
            q, k, v = scale_rows(rows, q, k, v)
        q = norm_rotary(q, cos, sin, q_w, self.eps, self.unit_offset)  # [T, H, D], qk-norm then rotary, fused
        k = norm_rotary(k, cos, sin, k_w, self.eps, self.unit_offset)
        if step.key_mask is not None:
            return cache.attend_static(q, k, v, step.slots, step.key_mask, self.scale).reshape(n, -1)
        return cache.attend(q, k, v, step.start, step.tree_mask, self.scale).reshape(n, -1)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [T, rotary_dim]
        step: StepInput,
        cache: AttentionCache,
    ) -> torch.Tensor:  # [T, hidden]
        n = x.shape[0]
        if self.qkv_packed is not None:
            q, k, v = packed_outputs(self.qkv_packed, x, [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features])
        elif self.qkv_weight is not None:
            q, k, v = projection.linear(x, self.qkv_weight, self.qkv_bias, self.gemv_tables).split(
                [self.q_proj.weight.shape[0], self.k_proj.weight.shape[0], self.v_proj.weight.shape[0]], dim=-1)
        else:
            q, k, v = (projection.apply(p, x, self.gemv_tables) for p in (self.q_proj, self.k_proj, self.v_proj))  # apply: CPU row padding
        gate = None
        if self.gated:  # q_proj yields [q | gate] per head; gate: [T, H, D], a strided view
            q, gate = q.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        else:
            q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = self._attend(q, k, v, rope, step, cache)
        if gate is not None:
            out = sigmoid_gate(out, gate)
        return projection.apply(self.o_proj, out, self.gemv_tables)
