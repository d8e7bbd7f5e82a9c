"""Q4_K at M == 1 as integer dot products (dp4a): x quantized to 8 bits per group of 32, llama.cpp's MMVQ form.

The float GEMVs (gemv_q4k) spend about six operations a weight value turning a 4-bit code into a
float and multiplying it; the tensor-core form (mma_q4k) spends about five packing codes into the
wgmma fragment. At the H200's bandwidth a Q4_K value arrives every ~4.5 lane-instructions of the
whole GPU, so both run out of issue slots long before the memory does. Here x is quantized once per
call to int8 with one fp32 scale per group of 32 values (quantize_x_kernel; exact float group sums kept
for the min term), and a 32-bit word of codes (eight values: four low nibbles of group 2c, four high of
group 2c + 1) costs one mask, one shift, one mask and two `dp4a` (inline PTX): about 0.6 operations a
value. Per group g of a row:

    y += d sc_g dx_g sum_l q_l xq_l  -  dmin m_g s_g        (s_g = sum of x over the group, fp32)

The integer sums are exact; what differs from x @ dequant(W)^T is the rounding of x to 8 bits (the
relative error of a dot is ~1e-3, as in llama.cpp, whose CUDA matmuls all quantize x this way).
dp4a_q4k_ref states the result in plain torch (the same quantization of x, exact integer sums).

Codes (q4k_block.py): word j = 0..7 of chunk c holds code bytes 4j..4j+3, i.e. values 64c + 4j + i
(low nibbles) and 64c + 32 + 4j + i (high nibbles): the x words that pair with it are the int8 words
16c + j and 16c + 8 + j of the block's 64. Under the Triton interpreter (ASM False) the dot of a word
is plain integer arithmetic on its four bytes.

Split over K (narrow N): fp32 partials [SPLIT, N] added in order by the tile's last program (split_k.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Dp4aConfig, split_for
from treeflash.kernels.quant.q4k_block import WORDS, half_low, scale_min_int
from treeflash.kernels.quant.split_k import finish_split, finish_unfused, split_buffers

QX_GROUP = 32  # values of x per int8 scale


def quantize_x_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq int8 [M, K], dx fp32 [M, K / 32], s fp32 [M, K / 32]): per group of 32,
    xq = floor(x 127 / amax + 1/2) (0 where amax == 0), dx = amax / 127, s = sum of x (fp32)."""
    m, k = x.shape
    xg = x.float().reshape(m, k // QX_GROUP, QX_GROUP)
    amax = xg.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.floor(xg * inv[..., None] + 0.5).clamp(-127, 127).to(torch.int8).reshape(m, k)
    return xq, amax / 127.0, xg.sum(dim=2)


def q4k_fields(blocks: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks uint8 [N, K / 256 * 144] -> (d fp64 [N, K / 256], d sc_g, dmin m_g fp64 [N, K / 32],
    codes int64 [N, K / 32, 32]): the weight of value l of group g is d sc_g q_l - dmin m_g (ggml's order)."""
    n, nb = blocks.shape[0], k // 256
    raw = blocks.reshape(n, nb, 144)
    d = raw[..., 0:2].contiguous().view(torch.float16).double().reshape(n, nb)
    dmin = raw[..., 2:4].contiguous().view(torch.float16).double().reshape(n, nb)
    b = raw[..., 4:16].long()  # [N, nb, 12] (ggml's get_scale_min_k4)
    sc = torch.cat([b[..., 0:4] & 63, (b[..., 8:12] & 15) | ((b[..., 0:4] >> 6) << 4)], dim=-1)  # [N, nb, 8]
    mn = torch.cat([b[..., 4:8] & 63, (b[..., 8:12] >> 4) | ((b[..., 4:8] >> 6) << 4)], dim=-1)
    qs = raw[..., 16:].long().reshape(n, nb, 4, 1, 32)  # [N, nb, chunk, 1, byte]
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(n, nb * 8, QX_GROUP)  # group 2c: low nibbles, 2c + 1: high
    return d, (d[..., None] * sc).reshape(n, nb * 8), (dmin[..., None] * mn).reshape(n, nb * 8), q


def dp4a_q4k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                 quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """What q4k_dp4a_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as
    `quantized` gives it: quantize_x's output), against Q4_K blocks uint8 [N, K / 256 * 144]; the integer
    sums exact, the rest in fp64 -> [M, N]. (A tie x 127 / amax = j + 1/2 may round either way on the
    GPU, whose fp32 division is not IEEE: compare kernels on the same quantized x.)"""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    xq, dx, s = quantized if quantized is not None else quantize_x_ref(x)
    d, dsc, dmn, q = q4k_fields(blocks, k)
    isum = torch.einsum("ngl,mgl->mng", q, xq.long().reshape(m, nb * 8, QX_GROUP)).double()  # exact [M, N, groups]
    y = (isum * dsc[None] * dx.double()[:, None, :]).sum(-1) - (dmn[None] * s.double()[:, None, :]).sum(-1)
    return y.to(out_dtype or x.dtype)


@triton.jit
def quantize_x_kernel(X, XQ, XD, XS, XSI, K, GB: tl.constexpr, SUMS: tl.constexpr):
    """One program: GB groups of 32 values of row program_id(1) of X [M, K] -> XQ int8 [M, K],
    XD / XS fp32 [M, K / 32] (quantize_x_ref); SUMS (4 or 16): also XSI int32 [M, K / SUMS], the sums of
    xq over each SUMS values."""
    g = tl.program_id(0) * GB + tl.arange(0, GB)  # [GB] groups
    row = tl.program_id(1).to(tl.int64)
    ll = tl.arange(0, 32)
    ok = g < K // 32
    offs = row * K + g[:, None] * 32 + ll[None, :]
    x = tl.load(X + offs, mask=ok[:, None], other=0.0).to(tl.float32)  # [GB, 32]
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    q = tl.floor(x * inv[:, None] + 0.5)
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    tl.store(XQ + offs, q.to(tl.int8), mask=ok[:, None])
    tl.store(XD + row * (K // 32) + g, amax / 127.0, mask=ok)
    tl.store(XS + row * (K // 32) + g, tl.sum(x, axis=1), mask=ok)
    if SUMS > 0:
        si = tl.sum(tl.reshape(q.to(tl.int32), (GB, 32 // SUMS, SUMS)), axis=2)  # [GB, 32 / SUMS]
        h = tl.arange(0, 32 // SUMS)
        tl.store(XSI + row * (K // SUMS) + (32 // SUMS) * g[:, None] + h[None, :], si, mask=ok[:, None])


# one word of codes against its two x words: $2 codes, $3 / $4 the int8 x of the low / high nibbles
_DP4A_ASM = tl.constexpr("""{
.reg .b32 l, h;
and.b32 l, $2, 0x0F0F0F0F;
shr.u32 h, $2, 4;
and.b32 h, h, 0x0F0F0F0F;
dp4a.u32.s32 $0, l, $3, 0;
dp4a.u32.s32 $1, h, $4, 0;
}""")


@triton.jit
def _word_dots(q, xl, xh, ASM: tl.constexpr):
    """int32 code words q and x words xl, xh (same shape) -> (sum_i lo_i xl_i, sum_i hi_i xh_i) over
    the four bytes i (codes unsigned 4-bit, x signed 8-bit)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(_DP4A_ASM, "=r,=r,r,r,r", [q, xl, xh], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)
    else:
        lo = tl.zeros_like(q)
        hi = tl.zeros_like(q)
        for i in tl.static_range(4):
            lo += ((q >> (8 * i)) & 15) * ((xl << (24 - 8 * i)) >> 24)
            hi += ((q >> (8 * i + 4)) & 15) * ((xh << (24 - 8 * i)) >> 24)
    return lo, hi


@triton.jit
def exact_float(i):
    """int32 |i| < 2^22 -> fp32, exactly: (i + 0x4B400000) read as fp32 is 1.5 2^23 + i, so an integer add
    and a float subtraction replace the int-to-float conversion (a quarter-rate instruction)."""
    return (i + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _load_block(W, row_w, blk):
    """The words of super-block blk of each row: the header (w0: d | dmin << 16, w1..w3 the scales) [BLOCK_N]
    and the four chunks of code words [BLOCK_N, 8]."""
    jj = tl.arange(0, 8)
    base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] word offsets of the block
    q0 = tl.load(W + (base + 4)[:, None] + jj[None, :])
    q1 = tl.load(W + (base + 12)[:, None] + jj[None, :])
    q2 = tl.load(W + (base + 20)[:, None] + jj[None, :])
    q3 = tl.load(W + (base + 28)[:, None] + jj[None, :])
    return tl.load(W + base), tl.load(W + base + 1), tl.load(W + base + 2), tl.load(W + base + 3), q0, q1, q2, q3


@triton.jit
def _block_dot(XQ, XD, XS, blk, w0, w1, w2, w3, q0, q1, q2, q3, BLOCK_N: tl.constexpr, ASM: tl.constexpr):
    """[BLOCK_N] fp32: one super-block's share of y from its words (_load_block) and x's block blk."""
    jj = tl.arange(0, 8)
    acc_s = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum_g sc_g dx_g isum_g over the block
    acc_m = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum_g m_g s_g
    for c in tl.static_range(4):
        q = q0 if c == 0 else q1 if c == 1 else q2 if c == 2 else q3  # [BLOCK_N, 8] code words of chunk c
        xl = tl.load(XQ + blk * 64 + 16 * c + jj)  # [8] int8 x words of group 2c
        xh = tl.load(XQ + blk * 64 + 16 * c + 8 + jj)  # group 2c + 1
        lo, hi = _word_dots(q, tl.broadcast_to(xl[None, :], (BLOCK_N, 8)), tl.broadcast_to(xh[None, :], (BLOCK_N, 8)), ASM)
        for h in tl.static_range(2):
            g = 2 * c + h
            isum = tl.sum(lo if h == 0 else hi, axis=1)  # [BLOCK_N] int32, |isum| <= 8 * 4 * 15 * 127
            sc, mn = scale_min_int(w1, w2, w3, g)
            acc_s += exact_float(sc * isum) * tl.load(XD + blk * 8 + g)  # |sc isum| < 2^22
            acc_m += exact_float(mn) * tl.load(XS + blk * 8 + g)
    return half_low(w0) * acc_s - half_low(w0 >> 16) * acc_m


@triton.jit
def q4k_dp4a_kernel(XQ, XD, XS, W, Y, P, CNT, N, ROW_WORDS, BPS: tl.constexpr, BLOCK_N: tl.constexpr,
                    UNROLL: tl.constexpr, PREFETCH: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr,
                    FUSED: tl.constexpr = True):
    """Y [N] = x @ dequant(W)^T for BLOCK_N rows over BPS super-blocks (SPLIT > 1: split_k.finish_split over
    P [SPLIT, N] and CNT), x given as XQ (int8 as int32 words [K / 4]), XD, XS (fp32 [K / 32]). W: the Q4_K
    blocks as int32 words [N, ROW_WORDS]. BPS % UNROLL == 0. PREFETCH: block b + 1's words are loaded
    before block b is computed (UNROLL ignored), so a block's loads overlap the previous block's work."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS  # rows past N read row N - 1
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        w0, w1, w2, w3, q0, q1, q2, q3 = _load_block(W, row_w, part * BPS)
        for b in range(BPS):
            n0, n1, n2, n3, p0, p1, p2, p3 = _load_block(W, row_w, part * BPS + tl.minimum(b + 1, BPS - 1))
            acc += _block_dot(XQ, XD, XS, part * BPS + b, w0, w1, w2, w3, q0, q1, q2, q3, BLOCK_N, ASM)
            w0, w1, w2, w3, q0, q1, q2, q3 = n0, n1, n2, n3, p0, p1, p2, p3
    else:
        for b0 in range(0, BPS, UNROLL):
            for u in tl.static_range(UNROLL):
                w0, w1, w2, w3, q0, q1, q2, q3 = _load_block(W, row_w, part * BPS + b0 + u)
                acc += _block_dot(XQ, XD, XS, part * BPS + b0 + u, w0, w1, w2, w3, q0, q1, q2, q3, BLOCK_N, ASM)
    finish_split(acc, rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


@triton.jit
def _byte(w, i):
    """Byte i (an int32 tensor broadcast against w) of each word of w, 0..255."""
    return (w >> (8 * i)) & 255


@triton.jit
def _block_lanes(XQ, XD, XS, W, base, t, blk, ASM: tl.constexpr):
    """[BLOCK_N, 8] fp32: super-block blk's share of y per row and thread t [1, 8] of the row: thread t reads code
    words 4t .. 4t + 3 (chunk c = t // 2, words j = 4 (t % 2) ..) with one 16-byte load, so the row's eight
    threads read its 128 bytes of codes contiguously. Its share is d sc_g dx_g isum (its four words) for the
    chunk's two groups g = 2c, 2c + 1, and the two mins only in the chunk's first thread. base [BLOCK_N]: the
    block's first word."""
    c = t // 2
    w = tl.arange(0, 32)[None, :]  # [1, 32] the block's code words, thread t holding 4t .. 4t + 3
    q = tl.load(W + (base + 4)[:, None] + w)  # [BLOCK_N, 32]: contiguous along w, so one 16-byte load a thread
    xw = blk * 64 + 16 * (w // 8) + w % 8  # [1, 32] the x words of group 2c (+ 8: of 2c + 1), c = w // 8
    lo, hi = _word_dots(q, tl.load(XQ + xw), tl.load(XQ + xw + 8), ASM)
    bn: tl.constexpr = q.shape[0]
    il = tl.sum(tl.reshape(lo, (bn, 8, 4)), axis=2)  # [BLOCK_N, 8]: thread t's four words of group 2c
    ih = tl.sum(tl.reshape(hi, (bn, 8, 4)), axis=2)
    w0 = tl.load(W + base)[:, None]  # [BLOCK_N, 1] d | dmin << 16
    w1 = tl.load(W + base + 1)[:, None]  # scale / min bytes 0..3, 4..7, 8..11
    w2 = tl.load(W + base + 2)[:, None]
    w3 = tl.load(W + base + 3)[:, None]
    # groups 2c (c < 2: bytes 2c of w1 / w2 & 63; c >= 2: the 4-bit halves of w3's byte 2c - 4 and w1 / w2's top bits)
    acc_s = tl.zeros(il.shape, dtype=tl.float32)
    acc_m = tl.zeros(il.shape, dtype=tl.float32)
    for h in tl.static_range(2):
        g = 2 * c + h  # [1, 8]
        gg = g % 4
        b1 = _byte(w1, gg)
        b2 = _byte(w2, gg)
        b3 = _byte(w3, gg)
        sc = tl.where(g < 4, b1 & 63, (b3 & 15) | ((b1 >> 6) << 4))
        mn = tl.where(g < 4, b2 & 63, (b3 >> 4) | ((b2 >> 6) << 4))
        isum = il if h == 0 else ih
        acc_s += exact_float(sc * isum) * tl.load(XD + blk * 8 + g)  # |sc isum| < 2^22
        first = (t % 2) == 0  # the chunk's first thread adds the group's min term
        acc_m += tl.where(first, exact_float(mn) * tl.load(XS + blk * 8 + g), 0.0)
    return half_low(w0) * acc_s - half_low(w0 >> 16) * acc_m


@triton.jit
def q4k_lanes_kernel(XQ, XD, XS, W, Y, P, CNT, N, ROW_WORDS, BPS: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLIT: tl.constexpr, ASM: tl.constexpr, FUSED: tl.constexpr = True):
    """q4k_dp4a_kernel's result with eight threads a row, each reading 16 contiguous bytes of its codes: a warp's
    load covers four rows x 128 bytes (the [BLOCK_N, 8 words] tiles of q4k_dp4a_kernel take one chunk of 32
    bytes of 16 rows a load). Accumulated per (row, thread) in fp32, the eight added once at the end."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    t = tl.arange(0, 8)[None, :]  # [1, 8]
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS  # [BLOCK_N]
    acc = tl.zeros([BLOCK_N, 8], dtype=tl.float32)
    for b in range(BPS):
        blk = part * BPS + b
        base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] the block's first word (16-byte aligned)
        acc += _block_lanes(XQ, XD, XS, W, base, t, blk, ASM)
    finish_split(tl.sum(acc, axis=1), rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


def quantize_x(x: torch.Tensor, sums: int = 0) -> tuple[torch.Tensor, ...]:
    """quantize_x_ref through quantize_x_kernel: x [M, K] (contiguous, K % 32 == 0) -> xq int8 [M, K],
    dx, s fp32 [M, K / 32], and with sums 4 or 16 the sums of xq over each `sums` values (int32 [M, K / sums])."""
    if sums not in (0, 4, 16):
        raise ValueError(f"quantize_x: sums must be 0, 4 or 16, got {sums}")
    m, k = x.shape
    xq = torch.empty(m, k, dtype=torch.int8, device=x.device)
    dx = torch.empty(m, k // QX_GROUP, dtype=torch.float32, device=x.device)
    s = torch.empty_like(dx)
    si = torch.empty(m, k // sums, dtype=torch.int32, device=x.device) if sums else dx
    gb = 16
    quantize_x_kernel[(triton.cdiv(k // QX_GROUP, gb), m)](x, xq, dx, s, si, k, GB=gb, SUMS=sums, num_warps=4)
    return (xq, dx, s, si) if sums else (xq, dx, s)


def dp4a_q4k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Dp4aConfig, asm: bool,
             counters: torch.Tensor | None = None, lanes: bool = False) -> torch.Tensor:
    """out [1, N] = x [1, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32, for Q4_K
    blocks uint8 [N, K / 256 * 144] (contiguous). asm: dp4a in inline PTX (CUDA); False under the interpreter.
    lanes: q4k_lanes_kernel (eight threads a row, 16-byte loads) instead of q4k_dp4a_kernel."""
    n, nb = blocks.shape[0], k // 256
    xq, dx, s = quantize_x(x)
    words = blocks.view(torch.int32)  # [N, nb * 36]
    programs = triton.cdiv(n, cfg.block_n)
    split = split_for(nb, programs, cfg.min_programs)
    bps = nb // split
    unroll = cfg.unroll if bps % cfg.unroll == 0 else 1
    part, cnt = split_buffers(n, split, programs, out, counters)  # [SPLIT, N] fp32 partials
    if lanes:
        q4k_lanes_kernel[(programs, split)](xq.view(torch.int32), dx, s, words, out, part, cnt, n, words.shape[1], BPS=bps,
                                            BLOCK_N=cfg.block_n, SPLIT=split, ASM=asm, FUSED=cfg.fused_split,
                                            num_warps=cfg.num_warps)
    else:
        q4k_dp4a_kernel[(programs, split)](xq.view(torch.int32), dx, s, words, out, part, cnt, n, words.shape[1], BPS=bps,
                                           BLOCK_N=cfg.block_n, UNROLL=unroll, PREFETCH=cfg.prefetch, SPLIT=split, ASM=asm,
                                           FUSED=cfg.fused_split, num_warps=cfg.num_warps)
    finish_unfused(part, out, n, split, cfg.fused_split)
    return out
