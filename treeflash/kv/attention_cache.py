"""Attention KV cache of one layer: a static buffer per K and V, plus the attention that reads it.

The cache owns `attend` so that each storage format (dense here; q8_0/q4_0/tq3_0 in
kv/quantized.py) can read its own layout with its own kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

from treeflash.kernels.kv.kv_quant import Planes
from treeflash.kernels.pointwise.norm import _interpreting, scale_rows
from treeflash.kernels.attention.quant_attention import quant_attention_masked, visible_up_to
from treeflash.kernels.pointwise.rotary import norm_rotary, norm_rotary_into_cache
from treeflash.kernels.spec.commit import RowTable, commit_rows_table

if TYPE_CHECKING:
    from treeflash.kv.spec import CacheSpec

DENSE_TYPES = {"auto": None, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# what turns q and k: cos, sin [T, rotary_dim]; q_norm and k_norm weights [D] (or None); eps; unit_offset
RotaryArgs = tuple


class AttentionCache(Protocol):
    def attend(
        self,
        q: torch.Tensor,  # [T, H, D] (rotary applied)
        k: torch.Tensor,  # [T, Hkv, D] new keys (rotary applied)
        v: torch.Tensor,  # [T, Hkv, D] new values
        start: int,  # slot of the first new token = committed length
        tree_mask: torch.Tensor | None,  # [T, T] bool for a verify step; None = causal
        scale: float,
    ) -> torch.Tensor: ...  # [T, H, D]

    def attend_static(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        slots: torch.Tensor,  # [T] long: where the new keys/values go
        key_mask: torch.Tensor,  # [T, max_len] bool: which slots each query sees
        scale: float,
    ) -> torch.Tensor: ...  # [T, H, D]; fixed shapes, no host sync (CUDA-graph capturable)

    def commit(self, start: int, path: list[int]) -> None: ...
    def commit_static(self, dest: torch.Tensor, src: torch.Tensor, path_len: torch.Tensor | None = None) -> None: ...  # slots[dest] = slots[src] (the first path_len on the device, or all)
    def reset(self) -> None: ...
    def nbytes(self) -> int: ...


def build_mask(num_new: int, start: int, tree_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """[T, start + T] bool: the committed prefix plus causal (or tree-ancestor) visibility of new tokens."""
    if tree_mask is None:
        if num_new == 1:
            return None
        new = torch.ones(num_new, num_new, dtype=torch.bool, device=device).tril()
    else:
        new = tree_mask
    if start == 0:
        return new
    return torch.cat((torch.ones(num_new, start, dtype=torch.bool, device=device), new), dim=1)


# cuDNN's SDPA builds an execution plan the first time it sees a shape: ~40 ms a new shape on the
# H200 (0.5-0.6 s for the first of a kind), while flash and memory-efficient attention need none
# (0.05-9 ms first calls). Once planned cuDNN is 1.5-2.7x faster a call, which only pays back on big
# calls: 4096 x 8192 saves ~2.7 ms a layer. Every request brings new lengths (its prompt, the
# drafter's pass over the prompt, the last prefill chunk), so below this many query x key pairs
# SDPA runs without cuDNN (bench/results/s20/sdpa_plan.txt, docs/performance.md).
# A static-shape call (a CUDA graph's step: `static=True`) keeps cuDNN: its one shape is planned once,
# in the graph's warm-ups.
CUDNN_SDPA_MIN = 4096 * 8192
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_allows_cudnn(num_queries: int, num_keys: int, static: bool = False) -> bool:
    """Whether a CUDA SDPA call of this size may take cuDNN (a plan per new shape) or not; `static`:
    its shape repeats for the life of a CUDA graph."""
    return static or num_queries * num_keys >= CUDNN_SDPA_MIN


def _fused_sdpa(q: torch.Tensor) -> bool:
    """Whether attention_reference hands SDPA 4-D inputs (its fused kernels): on CUDA."""
    return q.is_cuda


def attention_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | CausalBias | None, scale: float,
    static: bool = False,
) -> torch.Tensor:
    """q: [T, H, D], keys/values: [S, Hkv, D], mask: [T, S] bool, None, or a lower-right causal bias
    (`causal_lower_right(T, S)`: query i sees keys up to S - T + i; SDPA then runs its fused causal
    kernels instead of materializing a [T, S] mask, which also kept it off the flash backend: a
    32K-token prefill of the 8B shape took 17 s in 4096-token chunks). static: a CUDA graph's step
    (see sdpa_allows_cudnn)."""
    # On CUDA [1, H, T, D]: SDPA's fused kernels (flash, memory-efficient, cuDNN) take only 4-D
    # inputs; 3-D ones always ran its math path (fp32 scores materialized: a 32K prefill of the 8B
    # shape, 17.5 s). On the CPU 3-D, which keeps the math path: its rows do not depend on how many
    # queries share a call, so a bf16 verify of a tree gives a token's logits bit for bit as its decode
    # step does (the CPU flash kernel does not: tests/models/test_int4.py's speculative run diverged)
    fused = _fused_sdpa(q)
    lead = (None,) if fused else ()
    args = (q.transpose(0, 1)[lead], keys.transpose(0, 1)[lead], values.transpose(0, 1)[lead])
    kw = dict(attn_mask=mask, scale=scale, enable_gqa=keys.shape[1] != q.shape[1])
    if fused and not sdpa_allows_cudnn(q.shape[0], keys.shape[0], static):
        with sdpa_kernel(_NO_CUDNN):
            out = F.scaled_dot_product_attention(*args, **kw)
    else:
        out = F.scaled_dot_product_attention(*args, **kw)
    return (out[0] if fused else out).transpose(0, 1)


def static_attention_reference(q, keys, values, mask, scale) -> torch.Tensor:
    """attention_reference for a static-shape (CUDA-graph) step: `static_buffer_attention`'s fallback."""
    return attention_reference(q, keys, values, mask, scale, static=True)


def new_token_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, tree_mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention of T new tokens at `start` over keys/values [start + T, Hkv, D] (theirs included):
    a prefill chunk (no tree mask, T > 1) through SDPA's fused lower-right causal kernels, one KV head
    at a time with its rows repeated for its query heads (those kernels take no GQA; repeating every
    head at once held 2 x group copies of the whole prefix: 3 GiB for the 27B shape at 128K); a tree
    (or one token) under its explicit visibility mask."""
    n = q.shape[0]
    if tree_mask is None and n > 1:  # a prefill chunk: causal, aligned to the end of the keys
        causal = causal_lower_right(n, start + n)
        hkv = keys.shape[1]
        if hkv == q.shape[1]:
            return attention_reference(q, keys, values, causal, scale)
        group = q.shape[1] // hkv  # SDPA's heads are independent: per KV head is the same result
        return torch.cat([attention_reference(q[:, h * group:(h + 1) * group], keys[:, h:h + 1].repeat_interleave(group, dim=1),
                                              values[:, h:h + 1].repeat_interleave(group, dim=1), causal, scale)
                          for h in range(hkv)], dim=1)
    return attention_reference(q, keys, values, build_mask(n, start, tree_mask, q.device), scale)


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Static-shape attention without copying K/V per query head (GQA by grouping queries).

    q: [T, H, D]; keys/values: [S, Hkv, D] (strided views of the cache); mask: [T, S] bool -> [T, H, D].
    """
    t, h, d = q.shape
    hkv = keys.shape[1]
    g = h // hkv
    qg = q.reshape(t, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, t * g, d)  # [Hkv, T*G, D]
    scores = torch.bmm(qg, keys.permute(1, 2, 0)).float() * scale  # [Hkv, T*G, S]
    scores = scores.view(hkv, t, g, -1).masked_fill(~mask[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype).view(hkv, t * g, -1)
    out = torch.bmm(probs, values.permute(1, 0, 2))  # [Hkv, T*G, D]
    return out.view(hkv, t, g, d).permute(1, 0, 2, 3).reshape(t, h, d)


def static_buffer_attention(
    q: torch.Tensor,  # [T, H, D]
    keys: torch.Tensor,  # [>= S, Hkv, D] a whole cache buffer (written through the step's slots)
    values: torch.Tensor,
    key_mask: torch.Tensor | None,  # [T, S] bool: which of the first S slots each query sees (None: see below)
    scale: float,
    slots: torch.Tensor | None = None,  # [T] long: the step's slots, the last the highest (the mask hides all past it)
    fallback=grouped_attention,
) -> torch.Tensor:  # [T, H, D]
    """Attention of a static-shape (CUDA-graph) step over a cache buffer. On CUDA, for bf16/fp16 buffers,
    the split-K Triton kernel straight from the buffer (kernels/attention/quant_attention.py), reading only up to
    slots[-1] and sharing those keys among its splits, so its time follows the context, not the buffer's
    length; elsewhere `fallback(q, keys[:S], values[:S], key_mask, scale)` in q's dtype.

    key_mask None (with slots): every query sees every slot up to slots[-1], the whole buffer being S (a
    bidirectional draft block): the kernel then builds and reads no mask."""
    if key_mask is None and slots is None:
        raise ValueError("static_buffer_attention: without a key_mask the slots must be given")
    name = {torch.bfloat16: "bf16", torch.float16: "f16"}.get(keys.dtype)
    d = q.shape[-1]
    kernel = q.is_cuda and name is not None and values.dtype == keys.dtype and q.shape[0] <= 128 and d in (32, 64, 128, 256)
    if key_mask is None and not kernel:  # (the kernel reads up to slots[-1] without a mask)
        key_mask = visible_up_to(slots, q.shape[0], keys.shape[0])
    if kernel:
        return quant_attention_masked(q, Planes(name, None, keys), Planes(name, None, values), key_mask, scale, slots=slots)
    s = key_mask.shape[-1]
    return fallback(q, keys[:s].to(q.dtype), values[:s].to(q.dtype), key_mask, scale)


class DenseAttentionCache:
    def __init__(self, num_kv_heads: int, head_dim: int, spec: "CacheSpec"):
        dtype_k = DENSE_TYPES[spec.cache_type_k] or spec.dtype
        dtype_v = DENSE_TYPES[spec.cache_type_v] or spec.dtype
        self.k = torch.zeros(spec.max_len, num_kv_heads, head_dim, dtype=dtype_k, device=spec.device)
        self.v = torch.zeros(spec.max_len, num_kv_heads, head_dim, dtype=dtype_v, device=spec.device)
        # K and V for commit_rows_table (one launch for both), where their rows have one size in bytes
        self.rows = RowTable([self.k, self.v]) if self.k.element_size() == self.v.element_size() else None

    def attend(self, q, k, v, start, tree_mask, scale):
        n = q.shape[0]
        self.k[start : start + n] = k.to(self.k.dtype)
        self.v[start : start + n] = v.to(self.v.dtype)
        return new_token_attention(q, self.k[: start + n].to(q.dtype), self.v[: start + n].to(q.dtype), start, tree_mask, scale)

    def attend_static(self, q, k, v, slots, key_mask, scale):
        self.k.index_copy_(0, slots, k.to(self.k.dtype))
        self.v.index_copy_(0, slots, v.to(self.v.dtype))
        return self._attend_written(q, key_mask, scale, slots)

    def attend_static_rotary(self, q, k, v, rotary: RotaryArgs, slots, key_mask, scale, rows=None):
        """attend_static for q and k before their (norm +) rotary: on the GPU one kernel turns the
        query heads and writes the turned keys and the values into the cache rows (no separate
        norm_rotary launches, no index_copy_). rows: None or (stream, eps), the input norm folded
        into the projection (kernels/pointwise/rotary.py): q, k and v are first scaled by 1 / rms(stream)."""
        cos, sin, q_w, k_w, eps, unit = rotary
        if (q.is_cuda or _interpreting()) and self.k.dtype == k.dtype and self.v.dtype == v.dtype:
            q = norm_rotary_into_cache(q, k, v, cos, sin, q_w, k_w, eps, unit, self.k, self.v, slots, rows)
            return self._attend_written(q, key_mask, scale, slots)
        if rows is not None:
            q, k, v = scale_rows(rows, q, k, v)
        q = norm_rotary(q, cos, sin, q_w, eps, unit)
        k = norm_rotary(k, cos, sin, k_w, eps, unit)
        return self.attend_static(q, k, v, slots, key_mask, scale)

    def _attend_written(self, q, key_mask, scale, slots=None):
        return static_buffer_attention(q, self.k, self.v, key_mask, scale, slots)

    def commit_static(self, dest: torch.Tensor, src: torch.Tensor, path_len: torch.Tensor | None = None) -> None:
        if path_len is not None and self.k.is_cuda and self.rows is not None:
            return commit_rows_table(self.rows, dest, src, path_len)  # K and V in one launch, the kept rows only
        self.k.index_copy_(0, dest, self.k.index_select(0, src))
        self.v.index_copy_(0, dest, self.v.index_select(0, src))

    def commit(self, start: int, path: list[int]) -> None:
        if path == list(range(len(path))):
            return  # already contiguous
        idx = torch.tensor(path, device=self.k.device) + start
        n = len(path)
        self.k[start : start + n] = self.k.index_select(0, idx)
        self.v[start : start + n] = self.v.index_select(0, idx)

    def reset(self) -> None:
        pass  # slots past seq_len are never read

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
