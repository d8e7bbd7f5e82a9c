"""The top-k log-probs of a few rows of logits in two launches (the DFlash drafter's graphed pass,
spec/dflash_graph.py), beside the plain-torch reference.

The drafter reads, per depth, the k most likely tokens and their log-probs (k up to the DDTree
budget, 1 for a chain) from [B-1, vocab] logits (15 x 49152 for the default model). In torch that
was a log-softmax (~11 us on the H200 inside a CUDA graph) and a radix top-k of ~12-15 kernels:
~70-75 us in all, of a ~1.3 ms speculative step. Here (H200, CUDA
graph, 15 x 49152 bf16) ~5 us for k = 1, ~16 us for k = 16, ~26 us for k = 48:

    stage 1, grid (R, cdiv(V, CHUNK)): per chunk of a row, its max and sum of exp(x - max), and its
             top kp keys (kp = the next power of two >= k), descending
    stage 2, grid (R,): the row's logsumexp from the chunks' (max, sum); the top k of the chunks'
             sorted runs (bitonic merges only); writes value - logsumexp and the ids

A key is one int64, so one comparison orders values and breaks ties: the fp32 value's bits mapped
to an int32 that orders as the value does (flip all but the sign bit of a negative), shifted up,
over 2^31 - 1 - index (ties: the lower index ranks first). Keys are distinct, so the top k is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting

CHUNK = 2048  # vocab entries per stage-1 program
MAX_K = 64


def _log2(n: int) -> int:
    """Of a power of two."""
    return n.bit_length() - 1


def topk_logprobs_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] (any float dtype) -> the k largest log-probs [R, k] fp32, sorted descending,
    and their ids [R, k] int64. The torch version (and the CPU path)."""
    return torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)


@triton.jit
def _key(x, idx):
    """fp32 values and int32 indices -> int64 keys ordered by value, then by lower index."""
    bits = x.to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)


@triton.jit
def _half(n: tl.constexpr, j: tl.constexpr):
    """[1, .., 2, .., 1] (n dims, the 2 at the j-th innermost): 0 on the left, 1 on the right half."""
    return tl.reshape(tl.arange(0, 2), [1] * (n - j - 1) + [2] + [1] * j)


@triton.jit
def _swap(h, flip, j: tl.constexpr):
    """One compare-and-swap along the j-th innermost dim of the hypercube h [2, 2, ..]: the larger key
    goes right where flip is 0, left where it is 1. The partner is the pair's sum minus the key (int64
    wraps, exactly): a sum, not the xor_sum tl.sort uses, which the interpreter reduces element by
    element."""
    n: tl.constexpr = len(h.shape)
    other = tl.sum(h, axis=n - 1 - j, keep_dims=True) - h
    return tl.where((h > other) != (flip ^ _half(n, j)), other, h)


@triton.jit
def _merge(h, stage: tl.constexpr, order: tl.constexpr):
    """Bitonic merge of runs of 2^stage keys: order 1 descending, 0 ascending, 2 alternating by run."""
    if order == 2:
        flip = _half(len(h.shape), stage)
    else:
        flip = order
    for i in tl.static_range(stage):
        h = _swap(h, flip, stage - 1 - i)
    return h


@triton.jit
def _top(keys, LOG_N: tl.constexpr, LOG_K: tl.constexpr, RUNS_SORTED: tl.constexpr):
    """keys [2^LOG_N] int64, distinct -> their largest 2^LOG_K, descending. Bitonic top-k: sort runs of
    2^LOG_K keys, ascending and descending in turn (skipped when the caller's runs are so already),
    then keep the larger half of each pair of runs (bitonic) and merge it, until one run is left."""
    h = tl.reshape(keys, [2] * LOG_N)
    if not RUNS_SORTED:
        for i in tl.static_range(1, LOG_K + 1):
            h = _merge(h, i, 2 if i < LOG_N else 1)
    for i in tl.static_range(LOG_K + 1, LOG_N + 1):
        h = tl.max(h, axis=len(h.shape) - 1 - LOG_K)
        h = _merge(h, LOG_K, 2 if i < LOG_N else 1)
    return tl.reshape(h, [2**LOG_K])


@triton.jit
def _chunk_kernel(LOGITS, STATS, CAND, V, NC, LOG_CHUNK: tl.constexpr, LOG_KP: tl.constexpr):
    row, c = tl.program_id(0), tl.program_id(1)
    idx = c * 2**LOG_CHUNK + tl.arange(0, 2**LOG_CHUNK)  # [CHUNK] vocab ids
    valid = idx < V
    x = tl.load(LOGITS + row.to(tl.int64) * V + idx, mask=valid, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf logits sums to 0, not nan
    s = tl.sum(tl.exp(x - m_safe), axis=0)
    slot = row * NC + c
    tl.store(STATS + 2 * slot, m)
    tl.store(STATS + 2 * slot + 1, s)
    keys = tl.where(valid, _key(x, idx), -9223372036854775807 - 1)  # the tail ranks below everything
    tl.store(CAND + slot.to(tl.int64) * 2**LOG_KP + tl.arange(0, 2**LOG_KP), _top(keys, LOG_CHUNK, LOG_KP, False))


@triton.jit
def _merge_kernel(STATS, CAND, TOP_LP, TOP_IDS, NC, K: tl.constexpr, LOG_KP: tl.constexpr, LOG_NCP: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, 2**LOG_NCP)  # [NCP] chunks, padded to a power of two
    has = c < NC
    m = tl.load(STATS + 2 * (row * NC + c), mask=has, other=float("-inf"))
    s = tl.load(STATS + 2 * (row * NC + c) + 1, mask=has, other=0.0)
    big = tl.max(m, axis=0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    lse = big_safe + tl.log(tl.sum(s * tl.exp(m - big_safe), axis=0))
    j = tl.arange(0, 2 ** (LOG_NCP + LOG_KP))  # [NCP * KP] candidates of all chunks
    r = j % 2**LOG_KP
    if LOG_NCP > 0:  # every chunk's run is descending: read the even ones backwards (ascending)
        r = tl.where((j >> LOG_KP) % 2 == 0, 2**LOG_KP - 1 - r, r)
    keys = tl.load(CAND + (row * NC).to(tl.int64) * 2**LOG_KP + (j - j % 2**LOG_KP) + r,
                   mask=j < NC * 2**LOG_KP, other=-9223372036854775807 - 1)
    top = _top(keys, LOG_NCP + LOG_KP, LOG_KP, True)  # [KP]
    mono = (top >> 32).to(tl.int32)
    value = (mono ^ ((mono >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    ids = 0x7FFFFFFF - (top & 0x7FFFFFFF)  # the low half is 2^31 - 1 - index: bit 31 is clear
    r = tl.arange(0, 2**LOG_KP)  # rank
    tl.store(TOP_LP + row * K + r, value - lse, mask=r < K)
    tl.store(TOP_IDS + row * K + r, ids, mask=r < K)


def topk_logprobs(logits: torch.Tensor, k: int, out: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] bf16/fp16/fp32, contiguous -> (top_lp [R, k] fp32, top_ids [R, k] int64): the k
    largest of log_softmax(logits) in fp32, sorted descending (ties: the lower id first), as
    topk_logprobs_reference. Two launches on CUDA (or under TRITON_INTERPRET), the reference
    elsewhere; `out` (top_lp, top_ids) is written in place when given."""
    if logits.dim() != 2 or not 1 <= k <= min(MAX_K, logits.shape[-1]):
        raise ValueError(f"topk_logprobs: logits [R, V] and 1 <= k <= min({MAX_K}, V); got {tuple(logits.shape)}, k {k}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"topk_logprobs: logits must be bf16, fp16 or fp32; got {logits.dtype}")
    r, v = logits.shape
    if out is not None and (out[0].shape != (r, k) or out[0].dtype != torch.float32 or not out[0].is_contiguous()
                            or out[1].shape != (r, k) or out[1].dtype != torch.long or not out[1].is_contiguous()):
        raise ValueError(f"topk_logprobs: out must be contiguous ([{r}, {k}] fp32, [{r}, {k}] int64)")
    if not (logits.is_cuda or _interpreting()):
        top_lp, top_ids = topk_logprobs_reference(logits, k)
        if out is None:
            return top_lp, top_ids
        out[0].copy_(top_lp)
        out[1].copy_(top_ids)
        return out
    if not logits.is_contiguous() or v >= 2**31 - CHUNK:
        raise ValueError(f"topk_logprobs: logits must be contiguous, V < 2^31 - {CHUNK}; got strides "
                         f"{logits.stride()}, V {v}")
    top_lp, top_ids = out if out is not None else (
        torch.empty(r, k, dtype=torch.float32, device=logits.device),
        torch.empty(r, k, dtype=torch.long, device=logits.device))
    nc = triton.cdiv(v, CHUNK)
    kp = max(2, triton.next_power_of_2(k))
    stats = torch.empty(r, nc, 2, dtype=torch.float32, device=logits.device)  # per chunk: max, sum of exp(x - max)
    cand = torch.empty(r, nc, kp, dtype=torch.long, device=logits.device)  # per chunk: its top kp keys, descending
    ncp = triton.next_power_of_2(nc)
    _chunk_kernel[(r, nc)](logits, stats, cand, v, nc, LOG_CHUNK=_log2(CHUNK), LOG_KP=_log2(kp), num_warps=4)
    # one warp merges up to 2048 candidates fastest (no barriers between its stages); two past that
    _merge_kernel[(r,)](stats, cand, top_lp, top_ids, nc, K=k, LOG_KP=_log2(kp), LOG_NCP=_log2(ncp),
                        num_warps=1 if ncp * kp <= 2048 else 2)
    return top_lp, top_ids
