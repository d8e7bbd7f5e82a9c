"""Rows mode of the GEMVs (kernels/gemv.py): a verify step's M rows through the decode step's
one-row arithmetic, so that every row of y is bit for bit what the one-row call gives it.

Program (n block, g) computes rows g*GROUP .. g*GROUP + GROUP - 1, one after another over its
weight tile: the tile comes from L2 (or memory) for the first row of the group and from L1 for the
others. GROUP = 1 is one program column per row (measured on the H200 at the SmolLM2 shapes: 2.5x
cuBLAS's GEMM at 32 rows, every row re-reading the weight from L2: docs/performance.md); larger
groups read it M / GROUP times. The one-row kernels' sum is reproduced exactly: BLOCK_K columns a
step, in order, into a [BLOCK_N, BLOCK_K] fp32 accumulator, then one reduction (`_row_dot`).
The references are gemv.gemv_reference / gemv_swiglu_reference; the tests compare every row with
its one-row call under the interpreter (tests/kernels/test_gemv.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels import pdl


@triton.jit
def _row_dot(X, w_rows, row_ok, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STEPS: tl.constexpr):
    """[BLOCK_N] fp32: this program's weight rows times one row of x, summed as the one-row kernels
    sum it (BLOCK_K columns a step, in order, then one reduction), so the result is theirs bit for bit."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for i in tl.static_range(STEPS):
        k = i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + k, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_rows_kernel(X, W, B, Y, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STEPS: tl.constexpr, GROUP: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Rows mode of `_gemv_kernel` (split 1, no norm) or, with SWIGLU, of `_gemv_swiglu_kernel` (W =
    [gate; up], [2N, K]; no norm prologue): program (n block, g) computes rows g*GROUP .. g*GROUP +
    GROUP - 1 of y [M, N], one after another over the same weight tile (L1 after the first)."""
    pid_n, g = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = W + rows.to(tl.int64)[:, None] * K
    u_rows = W + (rows + N).to(tl.int64)[:, None] * K  # SWIGLU: the up half
    pdl.trigger(PDL)
    pdl.wait(PDL)
    for r in range(GROUP):
        m = (g * GROUP + r).to(tl.int64)
        if m < M:
            part = _row_dot(X + m * K, w_rows, row_ok, K, BLOCK_N, BLOCK_K, STEPS)
            if SWIGLU:  # g and u round to the output dtype first, as in the one-row kernel
                up = _row_dot(X + m * K, u_rows, row_ok, K, BLOCK_N, BLOCK_K, STEPS)
                gate = part.to(Y.dtype.element_ty).to(tl.float32)
                up = up.to(Y.dtype.element_ty).to(tl.float32)
                part = gate / (1.0 + tl.exp(-gate)) * up
            elif HAS_BIAS:
                part += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
            tl.store(Y + m * N + rows, part.to(Y.dtype.element_ty), mask=row_ok)


def gemv_rows(xv: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, m_rows: int, cfg,
              group: int) -> torch.Tensor:
    """y [M * N] <- x [M * K] (flat, contiguous) W^T (+ bias), each row as the one-row `gemv` call
    with configuration cfg (split 1) computes it; `group` rows a program."""
    n, k = weight.shape
    group = max(1, min(group, m_rows))
    _gemv_rows_kernel[(triton.cdiv(n, cfg.block_n), triton.cdiv(m_rows, group))](
        xv, weight, bias if bias is not None else weight, y, m_rows, n, K=k, HAS_BIAS=bias is not None, SWIGLU=False,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, STEPS=triton.cdiv(k, cfg.block_k), GROUP=group,
        num_warps=cfg.num_warps, **pdl.kwargs(xv))
    return y


def gemv_swiglu_rows(x: torch.Tensor, gate_up: torch.Tensor, y: torch.Tensor, m_rows: int, cfg, group: int) -> torch.Tensor:
    """y [M, I] <- silu(x W_gate^T) * (x W_up^T) for x [M * K] (flat), each row as `gemv_swiglu`'s one-row call."""
    two_i, k = gate_up.shape
    i = two_i // 2
    group = max(1, min(group, m_rows))
    _gemv_rows_kernel[(triton.cdiv(i, cfg.block_n), triton.cdiv(m_rows, group))](
        x, gate_up, gate_up, y, m_rows, i, K=k, HAS_BIAS=False, SWIGLU=True, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, STEPS=triton.cdiv(k, cfg.block_k),
        GROUP=group, num_warps=cfg.num_warps, **pdl.kwargs(x))
    return y
