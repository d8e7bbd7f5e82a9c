"""A sampled device step's draws without a sort (spec/device_step.py), beside its plain-torch reference.

A sampled speculative step draws the target's token at every tree node from the processed
distribution (temperature, top-k, top-p, min-p). spec/sampling.processed_probs_static runs every
filter in one graph, top-k and top-p through a full sort of [nodes, vocab], and sample_static
draws by a cumsum and a searchsorted. On the H200 (SmolLM2-135M, 49 nodes x 49,152 tokens,
bench/results/s23/) the sort, the scan and the scatter took ~350 us of a 1.95 ms DDTree-48 step.

Most sampled requests set neither top-k nor top-p (the OpenAI API's defaults). For them the
distribution needs no order, and one program per row draws in three passes over its logits:

    m   = max_i x_i / T
    e_i = exp(x_i / T - m), kept where e_i >= min_p     (p_i >= min_p * p_max)
    Z   = sum of the kept e_i
    token = #{i : cumsum of kept e up to i <= u Z}      (searchsorted(cdf, u Z, right=True))

with u = uniforms(seed, counter, index[row]) (below), the counter-based hash sample_static draws with.
It draws from the same distribution as processed_probs_static + sample_static; the two may pick
different tokens where u Z lands within rounding of a cdf step (the sums run in another order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting

BLOCK = 4096  # logits per loop iteration


def sample_rows_reference(logits: torch.Tensor, fparams: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor,
                          index: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; fparams [3] fp32 (temperature > 0, top_p: ignored, min_p); seed, counter [1]
    long; index [N] long -> tokens [N] long. The torch path: spec/sampling.processed_probs_static with
    top-k and top-p off (softmax of logits / T, min-p, renormalized), then sample_static."""
    probs = torch.softmax(logits.float() / fparams[0], dim=-1)
    probs = probs.masked_fill(probs < fparams[2] * probs.amax(-1, keepdim=True), 0.0)
    return sample_static(probs / probs.sum(-1, keepdim=True), seed, counter, index)


_M31 = 0x7FFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (xor-shift-multiply rounds; every product stays below 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M31
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M31
    return x ^ (x >> 16)


def uniforms(seed: torch.Tensor, counter: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[N] fp32 in [0, 1), 24 random bits each, from a counter-based hash of (seed, counter, index)
    ([1], [1], [N] long on the device): no generator state, so a CUDA graph can replay it."""
    x = _mix((_mix(seed & _M31) ^ _mix((counter * 2 + 1) & _M31)) & _M31)
    x = _mix(x ^ (index & _M31))
    return (x >> 7).float() / float(1 << 24)


def sample_static(probs: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """probs [N, vocab] -> [N] long: row i draws with uniforms(seed, counter, index)[i] by the
    inverse CDF (a token of probability zero is never drawn)."""
    cdf = probs.cumsum(-1)
    u = uniforms(seed, counter, index)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


@triton.jit
def _mix_tl(x):
    """_mix in Triton (int64 lanes; every product stays below 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0x7FFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0x7FFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _sample_rows_kernel(LOGITS, FPARAMS, SEED, COUNTER, INDEX, OUT, stride_row,
                        V: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = LOGITS + row.to(tl.int64) * stride_row
    inv_t = 1.0 / tl.load(FPARAMS)
    min_p = tl.load(FPARAMS + 2)
    offs = tl.arange(0, BLOCK)
    # the uniform, as uniforms()
    seed = tl.load(SEED).to(tl.int64)
    counter = tl.load(COUNTER).to(tl.int64)
    idx = tl.load(INDEX + row).to(tl.int64)
    x = _mix_tl((_mix_tl(seed & 0x7FFFFFFF) ^ _mix_tl((counter * 2 + 1) & 0x7FFFFFFF)) & 0x7FFFFFFF)
    x = _mix_tl(x ^ (idx & 0x7FFFFFFF))
    u = (x >> 7).to(tl.float32) / 16777216.0
    # pass 1: the largest scaled logit
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        ok = start + offs < V
        s = tl.load(base + start + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        m_vec = tl.maximum(m_vec, s)
    m = tl.max(m_vec, axis=0)
    # pass 2: the kept mass
    z_vec = tl.zeros([BLOCK], tl.float32)
    last_vec = tl.full([BLOCK], -1, tl.int32)  # the last kept token: where a rounding-short cdf ends
    for start in range(0, V, BLOCK):
        ok = start + offs < V
        s = tl.load(base + start + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        e = tl.exp(s - m)
        kept = ok & (e >= min_p)
        z_vec += tl.where(kept, e, 0.0)
        last_vec = tl.maximum(last_vec, tl.where(kept, start + offs, -1))
    target = u * tl.sum(z_vec, axis=0)
    # pass 3: how many cdf entries are <= u Z (the cdf never decreases, so that count is the token)
    below = tl.zeros([BLOCK], tl.int32)
    run = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, V, BLOCK):
        ok = start + offs < V
        s = tl.load(base + start + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        e = tl.exp(s - m)
        e = tl.where(ok & (e >= min_p), e, 0.0)
        cdf = run + tl.cumsum(e, axis=0)
        below += (ok & (cdf <= target)).to(tl.int32)
        run += tl.sum(e, axis=0)
    last = tl.max(last_vec, axis=0)
    # never an id outside the vocabulary: a row with no kept token (NaN logits, or a temperature so
    # small that the scaled logits overflow) draws token 0, where the torch path's searchsorted
    # would clamp to the last id; either way garbage in, but no out-of-range embedding read after
    token = tl.where(last >= 0, tl.minimum(tl.sum(below, axis=0), last), 0)
    tl.store(OUT + row, token.to(tl.int64))


def sample_rows(logits: torch.Tensor, fparams: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor,
                index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One launch on CUDA (or under TRITON_INTERPRET), the reference elsewhere; the same contract as
    sample_rows_reference (top_p and top_k are not applied: callers use it only when both are off)."""
    n, vocab = logits.shape
    if logits.stride(-1) != 1:
        raise ValueError("sample_rows: the logits' last dimension must be contiguous")
    if fparams.dtype != torch.float32 or fparams.numel() < 3:
        raise ValueError("sample_rows: fparams must be fp32 [3] (temperature, top_p, min_p)")
    if index.shape != (n,):
        raise ValueError(f"sample_rows: index must be [{n}], got {tuple(index.shape)}")
    if not (logits.is_cuda or _interpreting()):
        tokens = sample_rows_reference(logits, fparams, seed, counter, index)
        return tokens if out is None else out.copy_(tokens)
    out = torch.empty(n, dtype=torch.long, device=logits.device) if out is None else out
    _sample_rows_kernel[(n,)](logits, fparams, seed, counter, index, out, logits.stride(0),
                              V=vocab, BLOCK=BLOCK, num_warps=8)
    return out
