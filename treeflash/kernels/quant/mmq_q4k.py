"""Small-M Q4_K matmul as integer tensor-core dots (2..128 rows of x: verify, drafting, prefill chunks), llama.cpp's MMQ form.

rows_q4k turns every code into a bf16 weight before its wgmma (about six operations a value, for
every value, whatever M is). Here x is rounded to int8 per group of 32 exactly as the decode step's
dp4a kernels round it (dp4a_q4k.quantize_x: one fp32 scale dx and the fp32 sum s per group), and the
codes go into the tensor cores as they are stored: per chunk c the [BLOCK_N, 32] code bytes become
two int8 tiles (low nibbles: group 2c, values 64c + l; high nibbles: group 2c + 1, values 64c + 32 + l)
with one mask, one shift and one mask per four bytes (inline PTX), and each group is one int8 tl.dot
of K = 32 (wgmma m64nBMk32 s8 on sm_90) into an exact int32 [BLOCK_N, BLOCK_M] tile I_g. The scales
come after, per group, in fp32 and as outer products over (weight row, row of x):

    y += d (sum_g (sc_g I_g) dx_g) - dmin (sum_g m_g s_g)        (per super-block, as dp4a_q4k)

sc_g I_g is exact in int32 and converted with the 2^23 trick (exact_float). The cost is about four
operations per output and group (BLOCK_M / 8 a weight value), against rows_q4k's six a value.

Operands swapped (acc [BLOCK_N, BLOCK_M] = codes @ xq^T, stored transposed): the weight rows fill the
tensor core's M side (64 a warpgroup) and the few rows of x its N side (BLOCK_M >= 16; rows past M
masked: zero codes of x, never stored).

Batch invariance: every output element goes through the same fp32 operations in the same order
whatever M, BLOCK_M or the row's position (the integer dots are exact, the scaling is elementwise),
and the split over K depends on N only (config.MmqConfig), so row r of an M-row call equals that row
alone bitwise. The per-element order is dp4a_q4k's: with the same split (min_programs and block_n of
the Dp4aConfig) a row equals the decode step's dp4a_q4k result too.

Split over K (narrow N) as in rows_q4k: fp32 partials [SPLIT, M, N] added in order by
gemv_q4k.split_sum_kernel. mmq_q4k_ref states the result in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import MmqConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import QX_GROUP, exact_float, quantize_x, quantize_x_ref
from treeflash.kernels.quant.gemv_q4k import split_sum_kernel
from treeflash.kernels.quant.q4k_block import WORDS, half_low, scale_min_int


def q4k_weight_fields(blocks: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks uint8 [N, K / 256 * 144] -> (d, dmin fp32 [N, K / 256], sc, mn int64 [N, K / 32], codes int64
    [N, K / 32, 32] in 0..15): value l of group g of block b weighs (d_b sc_g) q_l - dmin_b m_g (ggml's order)."""
    n, nb = blocks.shape[0], k // 256
    raw = blocks.reshape(n, nb, 144)
    d = raw[..., 0:2].contiguous().view(torch.float16).float().reshape(n, nb)
    dmin = raw[..., 2:4].contiguous().view(torch.float16).float().reshape(n, nb)
    b = raw[..., 4:16].long()  # [N, nb, 12] (ggml's get_scale_min_k4)
    sc = torch.cat([b[..., 0:4] & 63, (b[..., 8:12] & 15) | ((b[..., 0:4] >> 6) << 4)], dim=-1)  # [N, nb, 8]
    mn = torch.cat([b[..., 4:8] & 63, (b[..., 8:12] >> 4) | ((b[..., 4:8] >> 6) << 4)], dim=-1)
    qs = raw[..., 16:].long().reshape(n, nb, 4, 1, 32)  # [N, nb, chunk, 1, byte]
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(n, nb * 8, QX_GROUP)  # group 2c: low nibbles, 2c + 1: high
    return d, dmin, sc.reshape(n, nb * 8), mn.reshape(n, nb * 8), q


def q4k_weight_ref(blocks: torch.Tensor, k: int) -> torch.Tensor:
    """The weight fp32 [N, K] that q4k_weight_fields describes (equal to dequantize_ref: the test checks it)."""
    d, dmin, sc, mn, q = q4k_weight_fields(blocks, k)
    n, nb = d.shape
    dsc = (d.repeat_interleave(8, dim=1) * sc.float())[..., None]  # fp32 products in ggml's order
    dmn = (dmin.repeat_interleave(8, dim=1) * mn.float())[..., None]
    return (dsc * q.float() - dmn).reshape(n, k)


def mmq_q4k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, split: int = 1) -> torch.Tensor:
    """What q4k_mmq_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as `quantized`
    gives it: quantize_x's output), against Q4_K blocks uint8 [N, K / 256 * 144]; the integer sums exact, the
    scaling in fp32 in the kernel's order (per block: sum_g fl(sc_g I_g) dx_g and sum_g m_g s_g, then
    d acc_s - dmin acc_m; blocks added in order within each of `split` ranges, the ranges in order) -> [M, N].
    The kernel's fp32 products may fuse into multiply-adds on a GPU (so compare within ~1e-6 there)."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    xq, dx, s = quantized if quantized is not None else quantize_x_ref(x)
    d, dmin, sc, mn, q = q4k_weight_fields(blocks, k)
    isum = torch.einsum("ngl,mgl->mng", q, xq.long().reshape(m, nb * 8, QX_GROUP))  # exact [M, N, groups]
    ts = (isum * sc[None]).float()  # exact: |sc I| < 2^22
    acc = torch.zeros(split, m, n)
    bps = nb // split
    for p in range(split):
        for b in range(p * bps, (p + 1) * bps):
            acc_s = torch.zeros(m, n)
            acc_m = torch.zeros(m, n)
            for g in range(8 * b, 8 * b + 8):
                acc_s = acc_s + ts[:, :, g] * dx[:, g, None]
                acc_m = acc_m + mn[None, :, g].float() * s[:, g, None]
            acc[p] = acc[p] + (d[None, :, b] * acc_s - dmin[None, :, b] * acc_m)
    y = acc[0]
    for p in range(1, split):
        y = y + acc[p]
    return y.to(out_dtype or x.dtype)


# four code bytes -> the int8 codes of their low nibbles ($0) and high nibbles ($1)
_NIBBLES_ASM = tl.constexpr("""{
and.b32 $0, $2, 0x0F0F0F0F;
shr.u32 $1, $2, 4;
and.b32 $1, $1, 0x0F0F0F0F;
}""")


@triton.jit
def nibbles_int8(q, ASM: tl.constexpr):
    """uint8 code bytes [R, C] -> (lo, hi) int8 [R, C]: the low and the high nibble of each."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(_NIBBLES_ASM, "=r,=r,r", [q], dtype=(tl.int8, tl.int8), is_pure=True, pack=4)
    else:
        lo = (q & 15).to(tl.int8)
        hi = (q >> 4).to(tl.int8)
    return lo, hi


@triton.jit(do_not_specialize=["M"])  # one compile for every M of a BLOCK_M
def q4k_mmq_kernel(XQ, XDS, W, B, Y, P, M, M_PAD, N, K, ROW_WORDS, BPS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr, ASM: tl.constexpr):
    """Y [M, N] = x @ dequant(W)^T for BLOCK_N weight rows x BLOCK_M rows of x over BPS super-blocks (PARTIAL:
    the fp32 partial P [SPLIT, M, N] of this program's split instead); x as XQ int8 [M, K] and XDS fp32
    [K / 32, M_PAD, 2] (pack_scales). W: the Q4_K blocks as int32 words [N, ROW_WORDS], B the same memory as
    bytes. Weight rows past N and rows of x past M are clamped or zero (results dropped)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    part = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K
    ll = tl.arange(0, 32)
    mp = tl.arange(0, 2 * BLOCK_M)  # (dx, s) pairs of the rows of x
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for b in range(BPS):
        blk = part * BPS + b
        base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] word offsets of the block
        w0 = tl.load(W + base)
        w1 = tl.load(W + base + 1)
        w2 = tl.load(W + base + 2)
        w3 = tl.load(W + base + 3)
        acc_s = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # sum_g fl(sc_g I_g) dx_g over the block
        acc_m = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # sum_g m_g s_g
        for c in tl.static_range(4):
            q = tl.load(B + (4 * base + 16 + 32 * c)[:, None] + ll[None, :])  # [BLOCK_N, 32] code bytes
            lo, hi = nibbles_int8(q, ASM)
            for h in tl.static_range(2):
                g = 2 * c + h
                # [32, BLOCK_M] int8: group g of each row of x (rows past M zero-filled)
                xg = tl.load(XQ + x_row[None, :] + (blk * 256 + 32 * g + ll)[:, None], mask=m_ok[None, :], other=0)
                isum = tl.dot(lo if h == 0 else hi, xg, out_dtype=tl.int32)  # [BLOCK_N, BLOCK_M], |I| <= 32 * 15 * 127
                sc, mn = scale_min_int(w1, w2, w3, g)  # [BLOCK_N] int32
                # [BLOCK_M, 2] -> dx, s of group g for each row of x (rows past M: zeros): one 16-byte load per two rows
                dxs = tl.load(XDS + (blk * 8 + g).to(tl.int64) * (2 * M_PAD) + 2 * tl.program_id(2) * BLOCK_M + mp)
                dx, xs = tl.split(tl.reshape(dxs, (BLOCK_M, 2)))
                acc_s += exact_float(sc[:, None] * isum) * dx[None, :]  # |sc I| < 2^22
                acc_m += exact_float(mn)[:, None] * xs[None, :]
        acc += half_low(w0)[:, None] * acc_s - half_low(w0 >> 16)[:, None] * acc_m
    mask = (rows < N)[:, None] & m_ok[None, :]
    if PARTIAL:
        tl.store(P + (part * M + m[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=mask)
    else:
        tl.store(Y + m[None, :].to(tl.int64) * N + rows[:, None], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def pack_scales_kernel(XD, XS, XDS, M, G, M_PAD, GB: tl.constexpr):
    """XD, XS fp32 [M, G] -> XDS fp32 [G, M_PAD, 2] (XDS[g, m] = (XD[m, g], XS[m, g]); zeros for m >= M):
    program (i, m) writes GB groups of row m."""
    g = tl.program_id(0) * GB + tl.arange(0, GB)
    m = tl.program_id(1)
    ok = g < G
    dx = tl.load(XD + m * G + g, mask=ok & (m < M), other=0.0)
    xs = tl.load(XS + m * G + g, mask=ok & (m < M), other=0.0)
    pair = tl.arange(0, 2)
    tl.store(XDS + (g[:, None].to(tl.int64) * M_PAD + m) * 2 + pair[None, :], tl.join(dx, xs), mask=ok[:, None])


def pack_scales(dx: torch.Tensor, s: torch.Tensor, m_pad: int) -> torch.Tensor:
    """quantize_x's dx, s fp32 [M, G] -> fp32 [G, m_pad, 2], group-major: the mmq kernels load a group's (dx, s)
    of two rows of x as one 16-byte vector (in [M, G] they were scalar loads, one per output column and group)."""
    m, g = dx.shape
    xds = torch.empty(g, m_pad, 2, dtype=torch.float32, device=dx.device)
    gb = 64
    pack_scales_kernel[(triton.cdiv(g, gb), m_pad)](dx, s, xds, m, g, m_pad, GB=gb, num_warps=2)
    return xds


def block_m_for(m: int, cfg: MmqConfig) -> int:
    """BLOCK_M for M rows of x: the smallest power of two >= M, at least 16 (tl.dot), at most cfg.block_m."""
    return min(cfg.block_m, max(16, triton.next_power_of_2(m)))


def warps_for(block_m: int, cfg: MmqConfig) -> int:
    """cfg.num_warps per 32 rows of x's tile: a warpgroup's accumulators then span at most 32 rows of x, whose
    (dx, s) loads (64 floats) Triton keeps in the accumulators' layout; at 64 rows (128 floats, one per thread
    of a warpgroup) it loads them in another layout and converts through shared memory once per group."""
    return cfg.num_warps * max(1, block_m // 32)


def mmq_split(n: int, nb: int, cfg: MmqConfig) -> int:
    """The split over K of an N-row weight of nb blocks a row: counted over the weight rows' programs only, so
    it (and with it every row's order of fp32 sums) does not depend on M."""
    return split_for(nb, triton.cdiv(n, cfg.block_n), cfg.min_programs)


def mmq_q4k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: MmqConfig, asm: bool) -> torch.Tensor:
    """out [M, N] = x [M, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32 (quantize_x),
    for Q4_K blocks uint8 [N, K / 256 * 144] (contiguous). asm: the nibbles in inline PTX (CUDA); False under
    the interpreter."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    if x.shape[1] != k or not x.is_contiguous() or blocks.shape != (n, nb * 144) or not blocks.is_contiguous():
        raise ValueError(f"mmq_q4k: x [M, {k}] and blocks [N, {nb * 144}] must be contiguous, got {tuple(x.shape)}, {tuple(blocks.shape)}")
    if out.shape != (m, n) or not out.is_contiguous():
        raise ValueError(f"mmq_q4k: out must be contiguous [{m}, {n}], got {tuple(out.shape)}")
    xq, dx, s = quantize_x(x)
    bm = block_m_for(m, cfg)
    grid_m = triton.cdiv(m, bm)
    xds = pack_scales(dx, s, grid_m * bm)  # [K / 32, M_PAD, 2]
    words = blocks.view(torch.int32)  # [N, nb * 36]
    split = mmq_split(n, nb, cfg)
    part = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)  # [SPLIT, M, N] fp32
    q4k_mmq_kernel[(triton.cdiv(n, cfg.block_n), split, grid_m)](
        xq, xds, words, blocks, out, part, m, grid_m * bm, n, k, words.shape[1], BPS=nb // split, BLOCK_M=bm, BLOCK_N=cfg.block_n,
        PARTIAL=split > 1, ASM=asm, num_warps=warps_for(bm, cfg), num_stages=cfg.num_stages)
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out
