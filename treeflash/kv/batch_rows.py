"""A KV cache for a batch of independent rows (train/batch_gen.py: the target answering many prompts at once).

Rows b, columns j of one [B, L] grid: each row is its own sequence (its own positions, its own mask over
the columns), every row's new tokens of a step go to the same columns. Per attention layer one K and one V
buffer [B, Hkv, L, D]; grouped-query attention reads them without repeating the kv heads: the G query
heads of a kv head become G query rows of one SDPA call.

The model runs such a step through its own layers (CausalLM.forward_layers) with a batched-rows
StepInput (StepInput.rows): input_ids and positions [B * T] (row-major), slots [T] the grid columns the
step fills (the same for every row) and key_mask [B, T, L] (which columns each row's token sees). The
layers are row-wise except attention, which calls `attend_static` here: the only place the rows meet
their own keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class GroupedMask:
    """key_mask [B, T, L] -> [B, 1, G*T, L] (query row g * T + t' sees what token t' sees), built once per
    step and shared by every layer of a RowsCache (each layer gets the same key_mask tensor)."""

    def __init__(self) -> None:
        self.src: torch.Tensor | None = None
        self.grouped: torch.Tensor | None = None

    def __call__(self, key_mask: torch.Tensor, group: int) -> torch.Tensor:
        b, t, length = key_mask.shape
        if t == 1:
            return key_mask[:, None]  # [B, 1, 1, L]: broadcast over the G query rows, no copy
        if key_mask is not self.src or self.grouped.shape[2] != group * t:
            self.src = key_mask
            self.grouped = key_mask[:, None, None].expand(b, 1, group, t, length).reshape(b, 1, group * t, length)
        return self.grouped


class RowsAttentionCache:
    """One attention layer's K/V of a batch of rows: k, v [B, Hkv, L, D]."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, masks: GroupedMask | None = None):
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(f"RowsAttentionCache: k and v must be [B, Hkv, L, D] alike, got {tuple(k.shape)}, {tuple(v.shape)}")
        self.k, self.v = k, v
        self.masks = masks if masks is not None else GroupedMask()

    def rows(self, r0: int, r1: int) -> "RowsAttentionCache":
        """Rows [r0, r1) (views: writes reach this cache)."""
        return RowsAttentionCache(self.k[r0:r1], self.v[r0:r1])

    def attend_static(
        self,
        q: torch.Tensor,  # [B * T, H, D] rotary applied, row-major (row b's T tokens together)
        k: torch.Tensor,  # [B * T, Hkv, D] rotary applied
        v: torch.Tensor,  # [B * T, Hkv, D]
        slots: torch.Tensor,  # [T] long: the grid columns this step writes (every row alike)
        key_mask: torch.Tensor,  # [B, T, L] bool: which columns each row's token sees
        scale: float,
    ) -> torch.Tensor:  # [B * T, H, D]
        b, hkv, _, d = self.k.shape
        t = slots.shape[0]
        group = q.shape[1] // hkv
        if q.shape[0] != b * t or key_mask.shape != (b, t, self.k.shape[2]):
            raise ValueError(f"RowsAttentionCache: {b} rows x {t} tokens, got q {tuple(q.shape)}, key_mask {tuple(key_mask.shape)}")
        self.k.index_copy_(2, slots, k.view(b, t, hkv, d).transpose(1, 2).to(self.k.dtype))  # [B, Hkv, T, D] into `slots`
        self.v.index_copy_(2, slots, v.view(b, t, hkv, d).transpose(1, 2).to(self.v.dtype))
        qg = q.view(b, t, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, group * t, d)  # query row g * T + t'
        o = F.scaled_dot_product_attention(qg, self.k, self.v, attn_mask=self.masks(key_mask, group), scale=scale)  # [B, Hkv, G*T, D]
        return o.view(b, hkv, group, t, d).permute(0, 3, 1, 2, 4).reshape(b * t, hkv * group, d)


class RowsCache:
    """Every layer's RowsAttentionCache (dense, attention-only models), as CausalLM.forward_layers reads a
    cache: `layers[i]` and `max_len` (positions stay below it)."""

    def __init__(self, layers: list[RowsAttentionCache]):
        if not layers:
            raise ValueError("RowsCache: no layers")
        masks = GroupedMask()  # one grouped key mask a step for every layer
        self.layers = [RowsAttentionCache(layer.k, layer.v, masks) for layer in layers]
        self.batch, self.max_len = layers[0].k.shape[0], layers[0].k.shape[2]

    @classmethod
    def zeros(cls, batch: int, num_layers: int, num_kv_heads: int, width: int, head_dim: int,
              dtype: torch.dtype, device: torch.device) -> "RowsCache":
        """[batch, num_kv_heads, width, head_dim] K and V per layer, zeroed."""
        def buf():
            return torch.zeros(batch, num_kv_heads, width, head_dim, dtype=dtype, device=device)

        return cls([RowsAttentionCache(buf(), buf()) for _ in range(num_layers)])

    def rows(self, r0: int, r1: int) -> "RowsCache":
        """Rows [r0, r1) of every layer (views), e.g. a prefill chunk of the batch."""
        return RowsCache([layer.rows(r0, r1) for layer in self.layers])
