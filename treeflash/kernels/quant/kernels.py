"""Triton kernels over stored GGUF blocks: the decode GEMV (M == 1), the small-M tile kernel
(2..128 rows: verify, drafting, prefill chunks) and a dequantizer to bf16 (larger M, via torch matmul).

All three read each row's blocks as stored (no repacking at load) and decode them group by group
(decode.py). A program owns BLOCK_N output rows and walks K one block at a time, so it streams
BLOCK_N contiguous byte ranges; rows past N are clamped to row N-1 (valid memory, result dropped),
which keeps the loads unmasked. The reduction order over K is fixed per row (no split-K, no atomics),
so results do not depend on scheduling.

GEMV: the weights of a group, w = scale * q + min, times x, accumulate elementwise into a
[BLOCK_N, S] fp32 tile; one row sum at the end (the cross-lane reduction once, not per group).
Small-M: per group, dot(x [BLOCK_M, S], q^T [S, BLOCK_N]) on tensor cores (q is an exact small
integer in bf16/fp16), times the per-row scale, plus rowsum(x) times the min. DOT_F32 (fp32 x, and
bf16 x under the interpreter, whose bf16 tl.dot is wrong) takes an IEEE fp32 dot instead; fp16 x
checks the native-dtype dot under the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from treeflash.kernels.quant.decode import group


@triton.jit
def gemv_kernel(X, B, H, Y, N, ROW_BYTES, NUM_BLOCKS: tl.constexpr,
                FMT: tl.constexpr, QK: tl.constexpr, BB: tl.constexpr, S: tl.constexpr, G: tl.constexpr,
                MIN_MODE: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr):
    """Y [N] = dequant(B)[N, K] @ X [K]; X any float dtype, Y the output dtype. NUM_BLOCKS % UNROLL == 0."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_base = tl.minimum(rows, N - 1).to(tl.int64) * ROW_BYTES  # [BLOCK_N] int64
    i = tl.arange(0, S)
    acc = tl.zeros([BLOCK_N, S], dtype=tl.float32)
    for b0 in range(0, NUM_BLOCKS, UNROLL):
        for u in tl.static_range(UNROLL):
            blk = b0 + u
            base = row_base + blk * BB
            for g in tl.static_range(G):
                q, sc, mn = group(FMT, B, H, base, g, S)
                xg = tl.load(X + blk * QK + g * S + i).to(tl.float32)  # [S]
                w = q * sc[:, None]
                if MIN_MODE == 1:
                    w = w + mn[:, None]
                elif MIN_MODE == -1:
                    w = w - mn[:, None]
                acc += w * xg[None, :]
    tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=rows < N)


@triton.jit
def rows_kernel(X, B, H, Y, M, N, K, ROW_BYTES, NUM_BLOCKS: tl.constexpr,
                FMT: tl.constexpr, QK: tl.constexpr, BB: tl.constexpr, S: tl.constexpr, G: tl.constexpr,
                MIN_MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
    """Y [M, N] = X [M, K] @ dequant(B)[N, K]^T for a BLOCK_M x BLOCK_N tile per program."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K  # [BLOCK_M]
    row_base = tl.minimum(rows, N - 1).to(tl.int64) * ROW_BYTES  # [BLOCK_N]
    i = tl.arange(0, S)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for blk in range(0, NUM_BLOCKS):
        base = row_base + blk * BB
        for g in tl.static_range(G):
            q, sc, mn = group(FMT, B, H, base, g, S)
            xg = tl.load(X + x_row[:, None] + (blk * QK + g * S + i)[None, :])  # [BLOCK_M, S] x dtype
            if DOT_F32:
                part = tl.dot(xg.to(tl.float32), tl.trans(q), input_precision="ieee")
            else:
                part = tl.dot(xg, tl.trans(q.to(xg.dtype)))
            acc += part * sc[None, :]
            if MIN_MODE == 1:
                acc += tl.sum(xg.to(tl.float32), axis=1)[:, None] * mn[None, :]
            elif MIN_MODE == -1:
                acc -= tl.sum(xg.to(tl.float32), axis=1)[:, None] * mn[None, :]
    tl.store(Y + m[:, None] * N + rows[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & (rows < N)[None, :])


@triton.jit
def dequant_kernel(B, H, W, N, K, ROW_BYTES,
                   FMT: tl.constexpr, QK: tl.constexpr, BB: tl.constexpr, S: tl.constexpr, G: tl.constexpr,
                   MIN_MODE: tl.constexpr, BLOCK_N: tl.constexpr):
    """W [N, K] (W's dtype) = dequant(B) for BLOCK_N rows and one block of columns per program."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    blk = tl.program_id(1)
    base = tl.minimum(rows, N - 1).to(tl.int64) * ROW_BYTES + blk * BB
    i = tl.arange(0, S)
    for g in tl.static_range(G):
        q, sc, mn = group(FMT, B, H, base, g, S)
        w = q * sc[:, None]
        if MIN_MODE == 1:
            w = w + mn[:, None]
        elif MIN_MODE == -1:
            w = w - mn[:, None]
        cols = blk * QK + g * S + i
        tl.store(W + rows.to(tl.int64)[:, None] * K + cols[None, :], w.to(W.dtype.element_ty), mask=(rows < N)[:, None])
