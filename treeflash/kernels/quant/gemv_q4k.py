"""The decode GEMV for Q4_K read as 32-bit words, with a fixed split over K for narrow outputs.

kernels.gemv_kernel decodes any format group by group from single bytes (decode.group): for Q4_K
that is ~20 loads of 1-32 bytes per row and block, each group's code bytes loaded twice and its
scale bytes one by one, and it measured 8-26% of the quantized-bytes roofline on the H200
(bench/results/quant_gemv.json). This kernel reads a Q4_K block (ggml's block_q4_K: fp16 d, fp16
dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit codes; 144 bytes = 36 words) as four
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

WORDS = 36  # a Q4_K block: 144 bytes


@triton.jit
def _half(w):
    """The low 16 bits of each int32 as an fp16, returned as fp32."""
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(w, shift):
    """int32 words -> the 4-bit code at bit `shift` (broadcast against w) of each, as an exact fp32."""
    return (((w >> shift) & 15) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _scale_byte(w1, w2, w3, i: tl.constexpr):
    """Byte i (0..11) of the block's 12 scale bytes, held in words w1..w3 ([R] int32)."""
    if i < 4:
        w = w1
    elif i < 8:
        w = w2
    else:
        w = w3
    return (w >> (8 * (i % 4))) & 255


@triton.jit
def _scale_min(w1, w2, w3, g: tl.constexpr):
    """Group g's 6-bit scale and min (ggml's get_scale_min_k4) as fp32 [R]."""
    if g < 4:
        sc = _scale_byte(w1, w2, w3, g) & 63
        mn = _scale_byte(w1, w2, w3, g + 4) & 63
    else:
        sc = (_scale_byte(w1, w2, w3, g + 4) & 15) | ((_scale_byte(w1, w2, w3, g - 4) >> 6) << 4)
        mn = (_scale_byte(w1, w2, w3, g + 4) >> 4) | ((_scale_byte(w1, w2, w3, g) >> 6) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


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
            base = tl.multiple_of(row_w + blk * 36, 4)  # [BLOCK_N] word offsets of the block
            w0 = tl.load(W + base)
            w1 = tl.load(W + base + 1)
            w2 = tl.load(W + base + 2)
            w3 = tl.load(W + base + 3)
            d = _half(w0)
            dmin = _half(w0 >> 16)
            for c in tl.static_range(4):
                q = tl.load(B + (4 * base + 16 + 32 * c)[:, None] + ll[None, :]).to(tl.int32)  # [BLOCK_N, 32] code bytes
                xb = X + blk * 256 + 64 * c
                if X_TILE:  # x read in the code tile's own layout ([BLOCK_N, 32], rows served by L1): no shuffle
                    x_lo = tl.load(xb + ll[None, :] + 0 * rows[:, None]).to(tl.float32)
                    x_hi = tl.load(xb + 32 + ll[None, :] + 0 * rows[:, None]).to(tl.float32)
                else:
                    x_lo = tl.load(xb + ll).to(tl.float32)[None, :]  # [1, 32]: values 64c + l
                    x_hi = tl.load(xb + 32 + ll).to(tl.float32)[None, :]
                sc_lo, m_lo = _scale_min(w1, w2, w3, 2 * c)
                sc_hi, m_hi = _scale_min(w1, w2, w3, 2 * c + 1)
                w_lo = _nibble(q, 0) * (d * sc_lo)[:, None] - (dmin * m_lo)[:, None]
                w_hi = _nibble(q, 4) * (d * sc_hi)[:, None] - (dmin * m_hi)[:, None]
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
