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
ENV = "TREEFLASH_GEMM_PDL"  # "0": cuBLAS (F.linear / addmm_) instead, for A/B runs
BLOCKS_ENV = "TREEFLASH_GEMM_PDL_BLOCKS"  # "BLOCK_N,BLOCK_K,num_warps": one configuration for all shapes (sweeps)


def enabled(x: torch.Tensor) -> bool:
    """Whether gemm runs the Triton kernel for x: on CUDA with PDL available (without PDL it has
    nothing over cuBLAS), or under the interpreter (the tests), unless TREEFLASH_GEMM_PDL=0."""
    if os.environ.get(ENV) == "0":
        return False
    return _interpreting() or pdl.flag(x)


def gemm_ref(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: fp32 products and sums, one rounding to the output dtype."""
    y = x.float() @ w.float().t()
    if add_into is None:
        return y.to(x.dtype)
    add_into.copy_((add_into.float() + y).to(add_into.dtype))
    return add_into


@triton.jit
def _gemm_kernel(X, W, Y, M, N, stride_x, stride_w, stride_y,
                 K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ADD: tl.constexpr, F32: tl.constexpr, PDL: tl.constexpr = False):
    """F32: fp32 products (fp32 inputs, or any under the interpreter, whose bf16 dot is not exact)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    n_ok, m_ok = n < N, m < M
    w_rows = W + n.to(tl.int64)[:, None] * stride_w
    x_rows = X + m.to(tl.int64)[:, None] * stride_x
    # the first weight tile before the wait: the previous kernel (whose output is x) may still run
    pdl.trigger(PDL)
    w_next = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & (kk < K)[None, :], other=0.0)
    pdl.wait(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for i in tl.static_range(0, K, BLOCK_K):  # unrolled: every step's loads can go out early
        w = w_next
        if i + BLOCK_K < K:
            k1 = i + BLOCK_K + kk
            w_next = tl.load(w_rows + k1[None, :], mask=n_ok[:, None] & (k1 < K)[None, :], other=0.0)
        k = i + kk
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        if F32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    out = Y + m.to(tl.int64)[:, None] * stride_y + n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if ADD:  # in place: each output is read and written by this program only
        acc += tl.load(out, mask=ok, other=0.0).to(tl.float32)
    tl.store(out, acc.to(Y.dtype.element_ty), mask=ok)


def config(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for an [m, k] x [n, k]^T product: 16..64 rows a block,
    and n-blocks small enough that a small model's projections still spread over ~30+ programs."""
    block_m = min(MAX_ROWS, max(16, triton.next_power_of_2(m)))
    over = os.environ.get(BLOCKS_ENV)
    if over:  # "BLOCK_N,BLOCK_K,num_warps" for every shape (bench/gemm_pdl_time.py's sweep)
        block_n, block_k, warps = (int(v) for v in over.split(","))
        return block_m, block_n, block_k, warps
    block_n = 32 if n >= 1024 else 16
    return block_m, block_n, 64, 4


def gemm(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x's dtype; with add_into ([M, N], contiguous rows) the product
    is added into it in place and it is returned. Falls back to the reference off CUDA (outside the
    interpreter)."""
    if not (x.is_cuda or _interpreting()):
        return gemm_ref(x, w, add_into)
    mm, kk = x.shape
    nn = w.shape[0]
    if w.shape[1] != kk or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"gemm: x {tuple(x.shape)} and w {tuple(w.shape)} need matching K and unit column strides")
    y = add_into if add_into is not None else torch.empty(mm, nn, dtype=x.dtype, device=x.device)
    if y.shape != (mm, nn) or y.stride(1) != 1:
        raise ValueError(f"gemm: add_into {tuple(y.shape)} must be [{mm}, {nn}] with unit column stride")
    bm, bn, bk, warps = config(mm, nn, kk)
    grid = (triton.cdiv(nn, bn), triton.cdiv(mm, bm))
    _gemm_kernel[grid](x, w, y, mm, nn, x.stride(0), w.stride(0), y.stride(0), K=kk, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                       ADD=add_into is not None, F32=_interpreting() or x.dtype == torch.float32, num_warps=warps, num_stages=1, **pdl.kwargs(x))
    return y


def project(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """A folded verify layer's projection: x @ w^T (added into add_into in place, when given) through
    this kernel where `enabled`, else cuBLAS (F.linear, addmm_ with beta = 1)."""
    if enabled(x):
        return gemm(x, w, add_into)
    return torch.nn.functional.linear(x, w) if add_into is None else add_into.addmm_(x, w.t())
