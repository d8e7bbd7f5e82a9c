"""MTPHead: the multi-token-prediction layer(s) that Qwen3.5/3.6 (and Qwen3-Next) checkpoints carry.

    h = fc(cat(pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(hidden_t)))   # [T, H]
    h = layers[i](h)          full-attention decoder layer(s), with an attention KV cache of their own
    h = norm(h)               the head's own final norm; logits = target.head(h)

`hidden_t` is the target's hidden state at position t after the target's final norm
(`ForwardOutput.hidden`; vLLM feeds this, and llama.cpp measured higher acceptance with it than
with the pre-norm state), x_{t+1} the token that follows, and positions[t] = t; h then predicts
x_{t+2}. Chained, the output h and the embedding of the drafted token feed the next call; the
drafted rows are dropped afterwards with `cache.truncate(committed_len)`.

Weight names (checkpoints store them under `mtp.`; transformers 5.17 has no MTP module and drops
them, so they follow vLLM's qwen3_5_mtp / qwen3_next_mtp): mtp.fc.weight [H, 2H],
mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight (unit-offset
RMSNorms, like the target's), mtp.layers.{i}.* (the target's full-attention DecoderLayer names).

The loader builds `MTPHead(config, config.mtp_num_layers)`, sets it as `model.mtp` on the CausalLM
(so the `mtp.*` checkpoint names load by name), and drafters call `model.mtp(...)` with
`model.embed` and `model.head`. CausalLM itself never calls it.
"""

from __future__ import annotations

import torch
from torch import nn

from treeflash.kv.cache import ATTENTION, CacheLayout, CacheSpec, ModelCache
from treeflash.models.config import FULL_ATTENTION, ModelConfig
from treeflash.models.layers import RMSNorm, Rotary
from treeflash.models.step import StepInput
from treeflash.models.transformer import DecoderLayer


class MTPHead(nn.Module):
    def __init__(self, config: ModelConfig, num_layers: int):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"MTPHead needs at least one layer, got {num_layers}")
        h, eps, off = config.hidden_size, config.rms_norm_eps, config.norm_unit_offset
        self.config = config
        self.pre_fc_norm_embedding = RMSNorm(h, eps, off)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, off)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(config, FULL_ATTENTION) for _ in range(num_layers))
        self.norm = RMSNorm(h, eps, off)
        self.rotary = Rotary(config)  # buffers only, not in the state dict

    def new_cache(self, max_len: int, cache_type_k: str = "auto", cache_type_v: str = "auto") -> ModelCache:
        """A KV cache for the head's own attention layers (attention only, so `truncate` rolls drafts back)."""
        c = self.config
        layout = CacheLayout((ATTENTION,) * len(self.layers), c.num_kv_heads, c.head_dim)
        weight = self.fc.weight
        return ModelCache(layout, CacheSpec(max_len, weight.dtype, weight.device, cache_type_k, cache_type_v))

    def forward(
        self,
        token_embeds: torch.Tensor,  # [T, H] target embedding of the token after each position
        hidden: torch.Tensor,  # [T, H] target's final hidden state at each position
        positions: torch.Tensor,  # [T] long
        cache: ModelCache,  # from new_cache; T rows are appended and committed
    ) -> torch.Tensor:  # [T, H] after the head's norm: feed to the target's head for logits
        n = token_embeds.shape[0]
        # a plain step: the head has no token ids of its own, input_ids only sizes the step
        step = StepInput(input_ids=positions, positions=positions, start=cache.seq_len)
        cache.begin(n, verify=False)
        x = self.fc(torch.cat((self.pre_fc_norm_embedding(token_embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        rope = self.rotary.cos_sin(positions, x.dtype)
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer(x, rope, step, layer_cache)
        cache.end_plain(n)
        return self.norm(x)
