"""A tensor-core GEMM for a verify step's few rows (2..64) that takes part in programmatic dependent
launch (kernels/pdl.py), beside the plain-torch reference.

Inside a small model's verify graph every cuBLAS GEMM is a hard boundary: it waits for the kernel
before it to drain, pays its own launch and ramp-up, and the kernel after it does the same. Our
other kernels of a layer (rotary, attention, SiLU-mul) already overlap their launch with their
predecessor's tail. This GEMM does too: its programs are placed while the previous kernel runs, read
their first weight tile (weights never change) and only then wait for the activations. With it,
every kernel of a folded verify layer (models/transformer.forward_folded) is a PDL kernel.

    y [M, N] = x [M, K] @ w [N, K]^T            (gemm)
    s [M, N] += x [M, K] @ w [N, K]^T, in place (gemm(..., add_into=s): the residual add of addmm_)

Program (n-block, m-block) computes BLOCK_M x BLOCK_N outputs with tl.dot over K in BLOCK_K steps
(unrolled: K is a constexpr), fp32 accumulation, one rounding to the output dtype (after the
residual add with add_into, as cuBLAS's beta = 1). No split-K: each output is one program's sum.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from treeflash.kernels import pdl
from treeflash.kernels.norm import _interpreting

MAX_ROWS = 64  # one m-block of 64 rows at most per program; more rows take more m-blocks
ENV = "TREEFLASH_GEMM_PDL"  # "1": this kernel on the GPU (off: cuBLAS, F.linear / addmm_), for A/B runs
BLOCKS_ENV = "TREEFLASH_GEMM_PDL_BLOCKS"  # "BLOCK_N,BLOCK_K,num_warps": one configuration for all shapes (sweeps)


def enabled(x: torch.Tensor) -> bool:
    """Whether `project` runs this kernel for x: opt-in on CUDA with PDL (TREEFLASH_GEMM_PDL=1; it lost
    to cuBLAS on the H200, docs/performance.md "Stop 24"), and under the interpreter (the CPU checks)
    unless TREEFLASH_GEMM_PDL=0."""
    env = os.environ.get(ENV)
    if _interpreting():
        return env != "0"
    return env == "1" and pdl.flag(x)


def gemm_ref(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: fp32 products and sums, one rounding to the output dtype."""
    y = x.float() @ w.float().t()
    if add_into is None:
        return y.to(x.dtype)
    add_into.copy_((add_into.float() + y).to(add_into.dtype))
    return add_into


@triton.jit
def _gemm_kernel(X, W, Y, P, T, M, N, stride_x, stride_w, stride_y, P_ROWS,
                 K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT: tl.constexpr, K_SPLIT: tl.constexpr, ADD: tl.constexpr, F32: tl.constexpr, PDL: tl.constexpr = False):
    """Program (n-block, m-block, s) sums K columns s * K_SPLIT .. (s + 1) * K_SPLIT - 1. SPLIT > 1: the
    partial sums go to P ([SPLIT, P_ROWS, N] fp32); the last program of an (n, m) block to take its
    ticket (T) adds them in split order (the same sum whichever program is last) and writes y.
    F32: fp32 products (fp32 inputs, or any under the interpreter, whose bf16 dot is not exact)."""
    pid_n, pid_m, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    kk = s * K_SPLIT + tl.arange(0, BLOCK_K)
    n_ok, m_ok = n < N, m < M
    w_rows = W + n.to(tl.int64)[:, None] * stride_w
    x_rows = X + m.to(tl.int64)[:, None] * stride_x
    # the first weight tile before the wait: the previous kernel (whose output is x) may still run
    pdl.trigger(PDL)
    w_next = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)
    pdl.wait(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for i in tl.static_range(0, K_SPLIT, BLOCK_K):  # unrolled: every step's loads can go out early
        w = w_next
        if i + BLOCK_K < K_SPLIT:
            k1 = kk + i + BLOCK_K
            w_next = tl.load(w_rows + k1[None, :], mask=n_ok[:, None] & (k1 < K)[None, :], other=0.0)
        k = kk + i
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        if F32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    out = Y + m.to(tl.int64)[:, None] * stride_y + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        _store(out, acc, ok, ADD)
    else:
        parts = P + m.to(tl.int64)[:, None] * N + n[None, :]
        tl.store(parts + s * P_ROWS * N, acc, mask=ok)
        ticket = T + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(ticket, 1, sem="acq_rel") == SPLIT - 1:  # release our partials, acquire the others'
            total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for j in tl.static_range(SPLIT):
                total += tl.load(parts + j * P_ROWS * N, mask=ok, other=0.0, cache_modifier=".cg")
            _store(out, total, ok, ADD)
            tl.atomic_xchg(ticket, 0)  # ready for the next call (and the next CUDA-graph replay)


@triton.jit
def _store(out, acc, ok, ADD: tl.constexpr):
    if ADD:  # in place: each output is read and written by one program only
        acc += tl.load(out, mask=ok, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out.dtype.element_ty), mask=ok)


def config(m: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, SPLIT) for an [m, k] x [n, k]^T product: 16..64 rows a
    block, small n-blocks and a split of K so that a small model's projections spread over many
    programs with few steps each."""
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(m)))
    over = os.environ.get(BLOCKS_ENV)
    if over:  # "BLOCK_N,BLOCK_K,num_warps[,SPLIT]" for every shape (bench/gemm_pdl_time.py's sweep)
        vals = [int(v) for v in over.split(",")]
        return block_m, vals[0], vals[1], vals[2], vals[3] if len(vals) > 3 else 1
    return block_m, 16, 64, 4, max(1, k // 192)


_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _scratch(device: torch.device, split: int, rows: int, n: int, tickets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial sums [split, rows, n] fp32 and zeroed tickets, kept per shape: a CUDA graph's replays
    reuse the ones its capture saw (the first call of a shape comes in a warm-up, outside capture)."""
    key = (device, split, rows, n, tickets)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(split, rows, n, dtype=torch.float32, device=device),
                         torch.zeros(tickets, dtype=torch.int32, device=device))
    return _SCRATCH[key]


def gemm(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype; with add_into ([M, N], unit column stride) the
    product is added into it in place and it is returned. Falls back to the reference off CUDA
    (outside the interpreter)."""
    if not (x.is_cuda or _interpreting()):
        return gemm_ref(x, w, add_into)
    mm, kk = x.shape
    nn = w.shape[0]
    if w.shape[1] != kk or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"gemm: x {tuple(x.shape)} and w {tuple(w.shape)} need matching K and unit column strides")
    y = add_into if add_into is not None else torch.empty(mm, nn, dtype=x.dtype, device=x.device)
    if y.shape != (mm, nn) or y.stride(1) != 1:
        raise ValueError(f"gemm: add_into {tuple(y.shape)} must be [{mm}, {nn}] with unit column stride")
    bm, bn, bk, warps, split = config(mm, nn, kk)
    k_split = triton.cdiv(triton.cdiv(kk, split), bk) * bk
    split = triton.cdiv(kk, k_split)
    grid = (triton.cdiv(nn, bn), triton.cdiv(mm, bm), split)
    rows = grid[1] * bm
    parts, tickets = _scratch(x.device, split, rows, nn, grid[0] * grid[1]) if split > 1 else (y, y)
    _gemm_kernel[grid](x, w, y, parts, tickets, mm, nn, x.stride(0), w.stride(0), y.stride(0), rows, K=kk, BLOCK_M=bm,
                       BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, K_SPLIT=k_split, ADD=add_into is not None,
                       F32=_interpreting() or x.dtype == torch.float32, num_warps=warps, num_stages=1, **pdl.kwargs(x))
    return y


def project(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """A folded verify layer's projection: x @ w^T (added into add_into in place, when given) through
    this kernel where `enabled`, else cuBLAS (F.linear, addmm_ with beta = 1)."""
    if enabled(x):
        return gemm(x, w, add_into)
    return torch.nn.functional.linear(x, w) if add_into is None else add_into.addmm_(x, w.t())
