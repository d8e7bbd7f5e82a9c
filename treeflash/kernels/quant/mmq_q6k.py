"""Small-M Q6_K matmul as integer tensor-core dots (2..128 rows of x), mmq_q4k's form on Q6_K's blocks.

x is rounded to int8 per group of 32 by dp4a_q4k.quantize_x, as the decode step (dp4a_q6k) rounds it. Block
layout and codes as in dp4a_q6k.py: per half n (values 128n ..) the code bytes A = ql[64n + l], B = ql[64n + 32 + l]
and H = qh[32n + l] (l = 0..31) give the four quarters t (values 128n + 32t + l) of 6-bit codes q'; here each
quarter becomes one int8 tile q' - 32 ([BLOCK_N, 32], values -32..31: inline PTX, about six operations per four
codes). A quarter spans two scales (sc[8n + 2t + s] for l in 16s .. 16s + 15), so it takes two int8 tl.dot of
K = 32 (wgmma m64nBMk32 s8), one against x's tile with l >= 16 zero-filled, one with l < 16 zero-filled (the
tensor cores have the time; the zeros come from the masked asynchronous copies of x): I_0, I_1 exact int32.
Then, per quarter and output, in dp4a_q6k's order:

    p = sc_0 I_0 + sc_1 I_1 (exact: |p| < 2^24; I_s converted by exact_float, |I_s| < 2^16)
    acc_b += p dx_g      per block: y += d acc_b

Batch invariance and the split over K (over pairs of blocks, counted over the weight rows' programs only) as in
mmq_q4k; with dp4a_q6k's split (Dp4aConfig's block_n and min_programs) a row equals the decode step's.

Alignment: rows start 2-byte aligned (210-byte blocks), so the code tiles are read as bytes at even offsets, as
rows_q6k does (not copied asynchronously: cp.async takes 4-16 bytes), and pass through shared memory into the
wgmma's register A operand. On sm_90 (tests/kernels/quant/test_mmq_q6k.py) BLOCK_M 16 needs 208 registers and no
spills; BLOCK_M 32 and 64 hit 255 registers and spill 64-224 bytes (not yet timed on a GPU; reading the rows in
word-aligned pairs as dp4a_q6k does is the next step). mmq_q6k_ref states the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import MmqConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import QX_GROUP, exact_float, quantize_x, quantize_x_ref
from treeflash.kernels.quant.dp4a_q6k import q6k_fields
from treeflash.kernels.quant.gemv_q4k import split_sum_kernel
from treeflash.kernels.quant.mmq_q4k import block_m_for, pack_scales, warps_for
from treeflash.kernels.quant.rows_q6k import D_HALF, HALVES, SCALES, scale_pair


def q6k_weight_ref(blocks: torch.Tensor, k: int) -> torch.Tensor:
    """The weight fp32 [N, K] of dp4a_q6k.q6k_fields in fp32, in ggml's order ((d sc) (q' - 32)): dequantize_ref's."""
    d, sc, q = q6k_fields(blocks, k)
    n = d.shape[0]
    dsc = d.float().repeat_interleave(16, dim=1) * sc.float()  # [N, K / 16]
    return (dsc[..., None] * (q - 32).float()).reshape(n, k)


def mmq_q6k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, split: int = 1) -> torch.Tensor:
    """What q6k_mmq_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as `quantized` gives
    it), against Q6_K blocks uint8 [N, K / 256 * 210]; p_g = sum_s sc I exact, then in fp32: per block d (sum_g p_g dx_g),
    the blocks added in order within each of `split` ranges, the ranges in order -> [M, N]."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    xq, dx, _ = quantized if quantized is not None else quantize_x_ref(x)
    d, sc, q = q6k_fields(blocks, k)
    isum = torch.einsum("ngl,mgl->mng", q - 32, xq.long().reshape(m, nb * 16, 16))  # exact [M, N, groups of 16]
    p = (isum * sc[None]).reshape(m, n, nb * 8, 2).sum(-1).float()  # [M, N, groups of 32]: exact, |p| < 2^24
    d = d.float()
    acc = torch.zeros(split, m, n)
    bps = nb // split
    for part in range(split):
        for b in range(part * bps, (part + 1) * bps):
            acc_b = torch.zeros(m, n)
            for g in range(8 * b, 8 * b + 8):
                acc_b = acc_b + p[:, :, g] * dx[:, g, None]
            acc[part] = acc[part] + d[None, :, b] * acc_b
    y = acc[0]
    for part in range(1, split):
        y = y + acc[part]
    return y.to(out_dtype or x.dtype)


# four bytes of ql ($1: A for quarters 0, 2; B for 1, 3) and of qh ($2) -> the int8 codes q' - 32 of quarter t:
# q' = nibble | 2 bits of H << 4, and q' - 32 (mod 256, per byte) = (q' + 0x60) ^ 0x80, with no carry between
# bytes (q' + 0x60 <= 0x9F); lop3 fuses the and / or pairs
_CODES_ASM = (
    "{ .reg .b32 t, u; and.b32 t, $1, 0x0F0F0F0F; shl.b32 u, $2, 4; and.b32 u, u, 0x30303030; or.b32 t, t, u; "
    "add.u32 t, t, 0x60606060; xor.b32 $0, t, 0x80808080; }",
    "{ .reg .b32 t, u; and.b32 t, $1, 0x0F0F0F0F; shl.b32 u, $2, 2; and.b32 u, u, 0x30303030; or.b32 t, t, u; "
    "add.u32 t, t, 0x60606060; xor.b32 $0, t, 0x80808080; }",
    "{ .reg .b32 t, u; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; and.b32 u, $2, 0x30303030; or.b32 t, t, u; "
    "add.u32 t, t, 0x60606060; xor.b32 $0, t, 0x80808080; }",
    "{ .reg .b32 t, u; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; shr.u32 u, $2, 2; and.b32 u, u, 0x30303030; "
    "or.b32 t, t, u; add.u32 t, t, 0x60606060; xor.b32 $0, t, 0x80808080; }",
)
_CODES_ASM0 = tl.constexpr(_CODES_ASM[0])
_CODES_ASM1 = tl.constexpr(_CODES_ASM[1])
_CODES_ASM2 = tl.constexpr(_CODES_ASM[2])
_CODES_ASM3 = tl.constexpr(_CODES_ASM[3])


@triton.jit
def codes_int8(q, h, T: tl.constexpr, ASM: tl.constexpr):
    """uint8 [R, C] bytes of ql (A for quarters 0, 2; B for 1, 3) and of qh -> the int8 codes q' - 32 of quarter T."""
    if ASM:
        if T == 0:
            c = tl.inline_asm_elementwise(_CODES_ASM0, "=r,r,r", [q, h], dtype=tl.int8, is_pure=True, pack=4)
        elif T == 1:
            c = tl.inline_asm_elementwise(_CODES_ASM1, "=r,r,r", [q, h], dtype=tl.int8, is_pure=True, pack=4)
        elif T == 2:
            c = tl.inline_asm_elementwise(_CODES_ASM2, "=r,r,r", [q, h], dtype=tl.int8, is_pure=True, pack=4)
        else:
            c = tl.inline_asm_elementwise(_CODES_ASM3, "=r,r,r", [q, h], dtype=tl.int8, is_pure=True, pack=4)
    else:
        qi = q.to(tl.int32)
        hi = h.to(tl.int32)
        if T < 2:
            lo = qi & 15
        else:
            lo = qi >> 4
        c = (lo | (((hi >> (2 * T)) & 3) << 4)) - 32
        c = c.to(tl.int8)
    return c


@triton.jit(do_not_specialize=["M"])  # one compile for every M of a BLOCK_M
def q6k_mmq_kernel(XQ, XDS, H, B, Y, P, M, M_PAD, N, K, ROW_HALVES, BPS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr, ASM: tl.constexpr):
    """Y [M, N] = x @ dequant(W)^T for BLOCK_N weight rows x BLOCK_M rows of x over BPS blocks (PARTIAL: the fp32
    partial P [SPLIT, M, N] instead); x as XQ int8 [M, K] and XDS fp32 [K / 32, M_PAD, 2] (mmq_q4k.pack_scales).
    H: the Q6_K blocks as int16 halves [N, ROW_HALVES], B the same memory as bytes."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    part = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    row_h = tl.minimum(rows, N - 1).to(tl.int64) * ROW_HALVES
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K
    ll = tl.arange(0, 32)
    first = (ll < 16)[:, None]  # [32, 1]: the values of a quarter's first scale
    mp = tl.arange(0, 2 * BLOCK_M)  # (dx, s) pairs of the rows of x
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for bb in range(BPS):
        blk = part * BPS + bb
        base = row_h + blk * HALVES  # [BLOCK_N] half offsets of the block
        d = tl.load(H + base + D_HALF).to(tl.float16, bitcast=True).to(tl.float32)
        acc_b = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for n in tl.static_range(2):
            a = tl.load(B + (2 * base + 64 * n)[:, None] + ll[None, :])  # [BLOCK_N, 32] uint8: ql[64n + l]
            b = tl.load(B + (2 * base + 64 * n + 32)[:, None] + ll[None, :])  # ql[64n + 32 + l]
            h = tl.load(B + (2 * base + 128 + 32 * n)[:, None] + ll[None, :])  # qh[32n + l]
            for t in tl.static_range(4):
                c = codes_int8(a if t % 2 == 0 else b, h, t, ASM)  # [BLOCK_N, 32] int8: values 128n + 32t + l
                xp = XQ + x_row[None, :] + (blk * 256 + 128 * n + 32 * t + ll)[:, None]  # [32, BLOCK_M]
                x0 = tl.load(xp, mask=first & m_ok[None, :], other=0)  # l < 16 only
                x1 = tl.load(xp, mask=(~first) & m_ok[None, :], other=0)  # l >= 16 only
                i0 = tl.dot(c, x0, out_dtype=tl.int32)  # [BLOCK_N, BLOCK_M], |I| <= 16 * 32 * 127
                i1 = tl.dot(c, x1, out_dtype=tl.int32)
                s0, s1 = scale_pair(tl.load(H + base + SCALES + 4 * n + t))  # [BLOCK_N] scales 8n + 2t, 8n + 2t + 1
                p = exact_float(i0) * s0[:, None] + exact_float(i1) * s1[:, None]  # exact: |p| < 2^24
                dxs = tl.load(XDS + (blk * 8 + 4 * n + t).to(tl.int64) * (2 * M_PAD) + 2 * tl.program_id(2) * BLOCK_M + mp)
                dx, xs = tl.split(tl.reshape(dxs, (BLOCK_M, 2)))
                acc_b += p * dx[None, :]
        acc += d[:, None] * acc_b
    mask = (rows < N)[:, None] & m_ok[None, :]
    if PARTIAL:
        tl.store(P + (part * M + m[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=mask)
    else:
        tl.store(Y + m[None, :].to(tl.int64) * N + rows[:, None], acc.to(Y.dtype.element_ty), mask=mask)


def mmq_split(n: int, pairs: int, cfg: MmqConfig) -> int:
    """The split over K of an N-row weight of `pairs` pairs of blocks a row (dp4a_q6k's unit), from N only."""
    return split_for(pairs, triton.cdiv(n, cfg.block_n), cfg.min_programs)


def mmq_q6k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: MmqConfig, asm: bool) -> torch.Tensor:
    """out [M, N] = x [M, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32 (quantize_x), for
    Q6_K blocks uint8 [N, K / 256 * 210] (contiguous; its start 2-byte aligned). An odd block count is not split.
    asm: the codes in inline PTX (CUDA); False under the interpreter."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    if x.shape[1] != k or not x.is_contiguous() or blocks.shape != (n, nb * 210) or not blocks.is_contiguous():
        raise ValueError(f"mmq_q6k: x [M, {k}] and blocks [N, {nb * 210}] must be contiguous, got {tuple(x.shape)}, {tuple(blocks.shape)}")
    if out.shape != (m, n) or not out.is_contiguous():
        raise ValueError(f"mmq_q6k: out must be contiguous [{m}, {n}], got {tuple(out.shape)}")
    xq, dx, s = quantize_x(x)
    bm = block_m_for(m, cfg)
    grid_m = triton.cdiv(m, bm)
    xds = pack_scales(dx, s, grid_m * bm)  # [K / 32, M_PAD, 2]
    halves = blocks.view(torch.int16)  # [N, nb * 105]
    split = mmq_split(n, nb // 2, cfg) if nb % 2 == 0 else 1
    part = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)  # [SPLIT, M, N] fp32
    q6k_mmq_kernel[(triton.cdiv(n, cfg.block_n), split, grid_m)](
        xq, xds, halves, blocks, out, part, m, grid_m * bm, n, k, halves.shape[1], BPS=nb // split, BLOCK_M=bm,
        BLOCK_N=cfg.block_n, PARTIAL=split > 1, ASM=asm, num_warps=warps_for(bm, cfg), num_stages=cfg.num_stages)
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out


__all__ = ["QX_GROUP", "mmq_q6k", "mmq_q6k_ref", "q6k_weight_ref"]
