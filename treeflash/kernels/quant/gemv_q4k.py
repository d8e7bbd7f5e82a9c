"""The decode GEMV for Q4_K read as 32-bit words, with a fixed split over K for narrow outputs.

kernels.gemv_kernel decodes any format group by group from single bytes (decode.group): for Q4_K
that is ~20 loads of 1-32 bytes per row and block, each group's code bytes loaded twice and its
scale bytes one by one, and it measured 8-26% of the quantized-bytes roofline on the H200
(bench/results/quant_gemv.json). This kernel reads a Q4_K block (ggml's block_q4_K, 36 words: q4k_block.py) as four
header words and four [BLOCK_N, 32]-byte tiles of codes (16-byte loads), decodes the 8 scales and
mins once per block from the header words, and turns each nibble into an exact fp32 with the
2^23 trick ((q | 0x4B000000) as fp32 is 2^23 + q) instead of an int-to-float conversion.

Codes: byte l of chunk c (qs[32c + l]) holds value 64c + l (low nibble, group
2c) and 64c + 32 + l (high nibble, group 2c + 1). y = sum over values of (d sc_g q - dmin m_g) x.

Split over K: program (n, s) covers blocks [s BPS, (s + 1) BPS) of BLOCK_N rows and writes an fp32
partial [SPLIT, N]; split_sum_kernel adds the SPLIT partials in order (a fixed reduction order, no
atomics), so results do not depend on scheduling. SPLIT == 1 writes y directly.
"""

from __future__ import annotations

import triton
import triton.language as tl

from treeflash.kernels.quant.q4k_block import WORDS, half_low, nibble, scale_min


@triton.jit
def q4k_gemv_kernel(X, W, B, Y, P, N, ROW_WORDS, BPS: tl.constexpr, SPLIT: tl.constexpr,
                    BLOCK_N: tl.constexpr, UNROLL: tl.constexpr, X_TILE: tl.constexpr):
    """X [K] (any float dtype) @ dequant(W)^T for BLOCK_N rows over BPS blocks: Y [N] (SPLIT == 1) or
    the fp32 partial P [SPLIT, N]. W: the blocks as int32 words [N, ROW_WORDS], B the same memory as
    bytes. BPS % UNROLL == 0. A chunk's 32 code bytes per row are one [BLOCK_N, 32] tile: byte l holds
    value 64c + l (low nibble) and 64c + 32 + l (high), so x is read contiguously too."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(1)
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS  # [BLOCK_N]; rows past N read row N-1
    ll = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_N, 32], dtype=tl.float32)  # sum of (d sc_g q - dmin m_g) x, per byte column
    for b0 in range(0, BPS, UNROLL):
        for u in tl.static_range(UNROLL):
            blk = part * BPS + b0 + u
            base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] word offsets of the block
            w0 = tl.load(W + base)
            w1 = tl.load(W + base + 1)
            w2 = tl.load(W + base + 2)
            w3 = tl.load(W + base + 3)
            d = half_low(w0)
            dmin = half_low(w0 >> 16)
            for c in tl.static_range(4):
                q = tl.load(B + (4 * base + 16 + 32 * c)[:, None] + ll[None, :]).to(tl.int32)  # [BLOCK_N, 32] code bytes
                xb = X + blk * 256 + 64 * c
                if X_TILE:  # x read in the code tile's own layout ([BLOCK_N, 32], rows served by L1): no shuffle
                    x_lo = tl.load(xb + ll[None, :] + 0 * rows[:, None]).to(tl.float32)
                    x_hi = tl.load(xb + 32 + ll[None, :] + 0 * rows[:, None]).to(tl.float32)
                else:
                    x_lo = tl.load(xb + ll).to(tl.float32)[None, :]  # [1, 32]: values 64c + l
                    x_hi = tl.load(xb + 32 + ll).to(tl.float32)[None, :]
                sc_lo, m_lo = scale_min(w1, w2, w3, 2 * c)
                sc_hi, m_hi = scale_min(w1, w2, w3, 2 * c + 1)
                w_lo = nibble(q, 0) * (d * sc_lo)[:, None] - (dmin * m_lo)[:, None]
                w_hi = nibble(q, 4) * (d * sc_hi)[:, None] - (dmin * m_hi)[:, None]
                acc += w_lo * x_lo + w_hi * x_hi
    y = tl.sum(acc, axis=1)
    if SPLIT == 1:
        tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=rows < N)
    else:
        tl.store(P + part * N + rows, y, mask=rows < N)


@triton.jit
def split_sum_kernel(P, Y, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Y [N] = sum over s of P [s, N], in order of s."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(P + s * N + offs, mask=ok, other=0.0)
    tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=ok)
