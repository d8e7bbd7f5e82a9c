"""Small-M Q6_K matmul (2..128 rows of x; M == 1 padded to 16), beside its plain-torch contract.

rows_q4k.py's structure on Q6_K's stored blocks (ggml's block_q6_K, 210 bytes = 105 int16 halves):
ql[128] (bytes 0-127, the low 4 bits of the codes), qh[64] (bytes 128-191, the high 2 bits),
scales[16] int8 (bytes 192-207, one per 16 values), d fp16 (bytes 208-209). Value e of the block
has scale sc[e // 16]; in half n (values 128n + 32s + l, s = 0..3, l = 0..31) its 6-bit code is

    s = 0: ql[64n + l]      & 15  |  ((qh[32n + l] >> 0) & 3) << 4
    s = 1: ql[64n + 32 + l] & 15  |  ((qh[32n + l] >> 2) & 3) << 4
    s = 2: ql[64n + l]      >> 4  |  ((qh[32n + l] >> 4) & 3) << 4
    s = 3: ql[64n + 32 + l] >> 4  |  ((qh[32n + l] >> 6) & 3) << 4

and its weight is (d sc) (q - 32) in fp32 (reference.py's _q6_k, in that order of products).

A program owns BLOCK_N weight rows and BLOCK_M rows of x and walks its range of super-blocks. Per
block it loads the 9 header halves once per row (the 8 int16 scale pairs: pair j holds scales 2j
and 2j + 1, and d) and, per half n, three [BLOCK_N, 32] byte tiles: ql[64n + l], ql[64n + 32 + l]
and qh[32n + l]. Step p of a half (values 128n + 64p + 32h + l) takes nibble p of the two ql tiles
and bits 4p + 2h of qh: two [BLOCK_N, 32] weight tiles (h = 0, 1) in fp32, rounded once to x's
dtype, joined into one [BLOCK_N, 64] tile in value order (column 32h + l, as rows_q4k does), so
x's [64, BLOCK_M] tile is one contiguous load and one tl.dot of K = 64 accumulates in fp32: four a
block. A 32-value tile spans two scales (pair 4n + 2p + h): the low byte for l < 16, the high one
after.

Alignment: the row stride is K / 256 * 210 bytes and a block 210, so a block (and a row) starts only
2-byte aligned: the header is read as int16 halves and the code tiles as bytes at even offsets
(2-byte accesses), never as 4-byte words. The codes' 2-byte loads are below the width that
Triton's pipeliner copies asynchronously (cp.async takes 4-16 bytes), so on sm_90
(tests/kernels/quant/test_rows_q6k.py) they go to registers directly and, unlike rows_q4k, each
rounded [BLOCK_N, 64] weight tile passes through shared memory (stmatrix / ldmatrix) into the
wgmma's register A operand; x is pipelined into shared memory as in rows_q4k. Not yet timed on a GPU.

Operands swapped (acc [BLOCK_N, BLOCK_M] = w_tile @ x^T, stored transposed): the weight rows fill
the tensor core's M side and the few rows of x its N side, which may be as small as 16, so M = 2
pads x to 16 rows (the padding rows masked: zero-filled, never read).

Precision: the weight is rounded to x's dtype (bf16/fp16) before the dot; fp32 x keeps it fp32
(IEEE fp32 dot). DOT_F32 also serves bf16 x under the Triton interpreter (its bf16 tl.dot is
wrong): the rounded weight and x go in as fp32, whose products of bf16 values are exact.
rows_q6k_ref states the result.

Split over K (narrow N): program (n, s, m) covers blocks [s BPS, (s + 1) BPS) and writes an fp32
partial P [SPLIT, M, N]; gemv_q4k.split_sum_kernel adds the SPLIT partials in order (a fixed
reduction order, no atomics). SPLIT is a divisor of the block count (config.split_for).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Q4kRowsConfig, split_for
from treeflash.kernels.quant.gemv_q4k import split_sum_kernel
from treeflash.kernels.quant.reference import dequantize_ref
from treeflash.kernels.quant.rows_q4k import block_m_for

HALVES = tl.constexpr(105)  # a Q6_K block: 210 bytes as int16 halves
SCALES = tl.constexpr(96)  # the half index of the scale pairs (byte 192)
D_HALF = tl.constexpr(104)  # the half index of d (byte 208)


def rows_q6k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What rows_q6k computes, in plain torch: x [M, K] @ w^T in fp32 -> [M, N] out_dtype, where w is
    dequantize_ref(blocks) rounded to x's dtype (kept fp32 for fp32 x)."""
    w = dequantize_ref(blocks, "Q6_K", k)  # [N, K] fp32
    if x.dtype != torch.float32:
        w = w.to(x.dtype).float()
    return (x.float() @ w.t()).to(out_dtype or x.dtype)


@triton.jit
def code_minus_32(ql, qh, lo_shift: tl.constexpr, hi_shift: tl.constexpr):
    """[R, C] int32 bytes of ql and qh -> q - 32 as an exact fp32, q = (ql >> lo_shift) & 15 | ((qh >> hi_shift) & 3) << 4:
    (q | 0x4B000000) read as fp32 is 2^23 + q, so one subtraction of 2^23 + 32 replaces an int-to-float conversion."""
    q = ((ql >> lo_shift) & 15) | (((qh >> hi_shift) & 3) << 4)
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388640.0


@triton.jit
def scale_pair(h):
    """[R] int16 halves -> the two int8 scales they hold (low byte, high byte) as fp32 [R] each."""
    v = h.to(tl.int32)  # sign-extended
    return ((v << 24) >> 24).to(tl.float32), (v >> 8).to(tl.float32)


@triton.jit(do_not_specialize=["M"])  # one compile for every M of a BLOCK_M
def q6k_rows_kernel(X, H, B, Y, P, M, N, K, ROW_HALVES, BPS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr,
                    ROUND_W: tl.constexpr, DOT_F32: tl.constexpr):
    """Y [M, N] = X [M, K] @ dequant(W)^T for BLOCK_N weight rows x BLOCK_M rows of x over BPS blocks
    (PARTIAL: the fp32 partial P [SPLIT, M, N] of this program's split instead). H: the Q6_K blocks
    as int16 halves [N, ROW_HALVES], B the same memory as bytes. Weight rows past N are clamped (loads
    unmasked, results dropped)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    part = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    row_h = tl.minimum(rows, N - 1).to(tl.int64) * ROW_HALVES
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K
    ll = tl.arange(0, 32)
    first = (ll < 16)[None, :]  # [1, 32]: columns of a tile's first scale
    kk = tl.arange(0, 64)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for b in range(BPS):
        blk = part * BPS + b
        base = row_h + blk * HALVES  # [BLOCK_N] half offsets of the block
        d = tl.load(H + base + D_HALF).to(tl.float16, bitcast=True).to(tl.float32)
        for n in tl.static_range(2):
            ql_a = tl.load(B + (2 * base + 64 * n)[:, None] + ll[None, :]).to(tl.int32)  # [BLOCK_N, 32]: ql[64n + l]
            ql_b = tl.load(B + (2 * base + 64 * n + 32)[:, None] + ll[None, :]).to(tl.int32)  # ql[64n + 32 + l]
            qh = tl.load(B + (2 * base + 128 + 32 * n)[:, None] + ll[None, :]).to(tl.int32)  # qh[32n + l]
            for p in tl.static_range(2):
                sa0, sa1 = scale_pair(tl.load(H + base + SCALES + 4 * n + 2 * p))  # scales of s = 2p
                sb0, sb1 = scale_pair(tl.load(H + base + SCALES + 4 * n + 2 * p + 1))  # s = 2p + 1
                da = tl.where(first, (d * sa0)[:, None], (d * sa1)[:, None])  # [BLOCK_N, 32]: d sc per column
                db = tl.where(first, (d * sb0)[:, None], (d * sb1)[:, None])
                w_a = da * code_minus_32(ql_a, qh, 4 * p, 4 * p)  # [BLOCK_N, 32]: values 128n + 64p + l
                w_b = db * code_minus_32(ql_b, qh, 4 * p, 4 * p + 2)  # values 128n + 64p + 32 + l
                # [64, BLOCK_M]: values 128n + 64p + kk; rows of x past M masked (zero-filled, not read)
                xt = tl.load(X + x_row[None, :] + (blk * 256 + 128 * n + 64 * p + kk)[:, None], mask=m_ok[None, :], other=0.0)
                if ROUND_W:
                    w_a = w_a.to(X.dtype.element_ty)
                    w_b = w_b.to(X.dtype.element_ty)
                wt = tl.join(w_a, w_b).permute(0, 2, 1).reshape(BLOCK_N, 64)  # [BLOCK_N, 64]: column 32h + l
                if DOT_F32:
                    acc += tl.dot(wt.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
                else:
                    acc += tl.dot(wt, xt)
    mask = (rows < N)[:, None] & m_ok[None, :]
    if PARTIAL:
        tl.store(P + (part * M + m[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=mask)
    else:
        tl.store(Y + m[None, :].to(tl.int64) * N + rows[:, None], acc.to(Y.dtype.element_ty), mask=mask)


def rows_q6k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Q4kRowsConfig,
             dot_f32: bool) -> torch.Tensor:
    """out [M, N] = x [M, K] (contiguous) @ dequant(blocks)^T for Q6_K blocks uint8 [N, K / 256 * 210]
    (contiguous; its start 2-byte aligned). dot_f32: take the IEEE fp32 dot (fp32 x; bf16 x under the
    interpreter). cfg: rows_q4k's configuration (BLOCK_N, BLOCK_M bound, warps, stages, split)."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    halves = blocks.view(torch.int16)  # [N, nb * 105]
    bm = block_m_for(m, cfg)
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, bm)
    split = split_for(nb, grid_n * grid_m, cfg.min_programs)
    part = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)  # [SPLIT, M, N] fp32
    q6k_rows_kernel[(grid_n, split, grid_m)](
        x, halves, blocks, out, part, m, n, k, halves.shape[1], nb // split, BLOCK_M=bm, BLOCK_N=cfg.block_n,
        PARTIAL=split > 1, ROUND_W=x.dtype != torch.float32, DOT_F32=dot_f32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out
