"""Q3_K at M == 1 as integer dot products (dp4a), x rounded to 8 bits per group of 32 as in dp4a_q4k.

ggml's block_q3_K (110 bytes, 256 values; reference.py's _q3_k):

    hmask[32]   bytes   0..31    words  0..7    bit G of byte j: the high bit of value 32 G + j
    qs[64]      bytes  32..95    words  8..23   byte 32 c + j, bits 2 s, 2 s + 1: the low 2 bits of value 128 c + 32 s + j
    scales[12]  bytes  96..107   words 24..26   6-bit scale of 16-group g: low 4 bits nibble g // 8 of byte g % 8,
                                                high 2 bits bits 2 (g // 4) of byte 8 + g % 4; the scale is that - 32
    d           bytes 108..109   word 27 (low half), fp16

The weight of value e = 32 G + j (32-group G = 4 c + s, j = 0..31; 16-group g = 2 G + j // 16) is
d (sc_g - 32) q with q = low2 - 4 hn in [-4, 3], hn = 1 - (hmask bit): the clear bit means -4.

A thread owns one half h = j // 16 of every 32-group of one row: 16-group 2 G + h, i.e. the four
words i = 0..3 of hmask word 4 h + i and of qs word 8 + 8 c + 4 h + i of each block, against the x
words 8 G + 4 h + i; every tensor is [BLOCK_N, 2] (row, h), one load a word: a warp's load covers
16 rows x 2 words, so its tags stay few, and every sum over a 16-group stays in the thread. Per
word and 32-group, two masks and two `dp4a.u32.s32` chained over the four words:

    dq += dp4a(qs & (0x03030303 << 2 s), x) = 4^s sum low2 x        dh += dp4a(~hmask & (0x01010101 << G), x) = 2^G sum hn x

so isum = dq / 4^s - 4 dh / 2^G (exact shifts; no -4 sum(x) term: the -4 rides on the cleared bits),
|isum| <= 16 * 4 * 127. (sc - 32) isum is an exact int32 (|.| < 2^22, converted by
dp4a_q4k.exact_float), times dx of the 32-group, accumulated in fp32 per (row, h); after the block
times d; the two halves are added once at the end. About 4 integer operations a word per 32-group
(one value in 4): ~1 a value for the codes, plus per 16-group its scale and one fp32 FMA.

Alignment: 110 bytes is not a multiple of 4, so the blocks of a row are word-aligned in pairs (220
bytes = 55 words; a row of an even number of blocks starts word-aligned in a contiguous tensor): a
pair's even block reads its words directly, the odd one (pair byte 110 = word 27 + 2) rebuilds each
word k from the aligned words 27 + k and 28 + k (high half, low half), one funnel shift a word; its
d is the high half of the pair's word 54. Rows of an odd number of blocks are refused with a
ValueError naming the shape (the caller routes them elsewhere). The blocks' words cannot be
read as 16-byte vectors (a pair is 55 words): the loads are 4-byte ones.

Split over K (narrow N) as in dp4a_q4k, over pairs; UNROLL pairs a loop step. Under the interpreter
(ASM False) dp4a and the funnel shift are plain integer arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Q4kDp4aConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import QX_GROUP, quantize_x, quantize_x_ref
from treeflash.kernels.quant.gemv_q4k import split_sum_kernel
from treeflash.kernels.quant.q4k_block import half_low

BLOCK_BYTES = 110
PAIR_WORDS = tl.constexpr(55)  # two Q3_K blocks: 220 bytes
ODD_WORD = tl.constexpr(27)  # the pair's odd block starts 2 bytes past this word


def q3k_fields(blocks: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q3_K blocks uint8 [N, K / 256 * 110] -> (d fp64 [N, K / 256], scales int64 [N, K / 16] (sc - 32,
    in -32..31), codes q int64 [N, K / 16, 16] in -4..3): the weight of value l of 16-group g is d sc_g q_l."""
    n, nb = blocks.shape[0], k // 256
    raw = blocks.reshape(n, nb, BLOCK_BYTES)
    d = raw[..., 108:110].contiguous().view(torch.float16).double().reshape(n, nb)
    s = raw[..., 96:108].long()  # [N, nb, 12]
    low = torch.cat([s[..., 0:8] & 15, s[..., 0:8] >> 4], dim=-1)  # [N, nb, 16]: scale g's low 4 bits
    high = torch.cat([(s[..., 8:12] >> (2 * t)) & 3 for t in range(4)], dim=-1)  # g = 4 t + i: bits 2t of byte 8 + i
    sc = ((low | high << 4) - 32).reshape(n, nb * 16)
    bits = torch.arange(8, device=blocks.device)
    hm = (raw[..., 0:32].long()[..., None, :] >> bits[:, None]) & 1  # [N, nb, G, j]: bit G of hmask byte j
    qs = raw[..., 32:96].long().reshape(n, nb, 2, 1, 32)  # [N, nb, c, 1, j]
    low2 = (qs >> (2 * torch.arange(4, device=blocks.device))[:, None]) & 3  # [N, nb, c, s, j]
    q = low2.reshape(n, nb, 8, 32) - 4 * (1 - hm)  # G = 4 c + s
    return d, sc, q.reshape(n, nb * 16, 16)


def dp4a_q3k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                 quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """What q3k_dp4a_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as
    `quantized` gives it: quantize_x's output), against Q3_K blocks uint8 [N, K / 256 * 110]; the integer
    sums exact (int64), the rest in fp64 -> [M, N]."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    xq, dx, _ = quantized if quantized is not None else quantize_x_ref(x)
    d, sc, q = q3k_fields(blocks, k)
    isum = torch.einsum("ngl,mgl->mng", q, xq.long().reshape(m, nb * 16, 16))  # exact [M, N, 16-groups]
    per32 = (isum * sc[None]).reshape(m, n, nb * 8, 2).sum(-1).double()  # [M, N, 32-groups]
    y = (per32 * dx.double()[:, None, :]).reshape(m, n, nb, 8).sum(-1)  # [M, N, blocks]
    return (y * d[None]).sum(-1).to(out_dtype or x.dtype)


# two dp4a of the same x word: $2 / $3 the code words (unsigned bytes), $4 the int8 x, $5 / $6 the sums so far
_DP4A2_ASM = tl.constexpr("""{
dp4a.u32.s32 $0, $2, $4, $5;
dp4a.u32.s32 $1, $3, $4, $6;
}""")
_FUNNEL_ASM = tl.constexpr("shf.r.clamp.b32 $0, $1, $2, 16;")


@triton.jit
def _dp4a2(a0, a1, b, c0, c1, ASM: tl.constexpr):
    """int32 [R, 2] words a0, a1 (four unsigned bytes each), b (four signed bytes), sums c0, c1 ->
    (c0 + sum_i a0_i b_i, c1 + sum_i a1_i b_i). Without ASM (the interpreter) the bytes are unpacked
    along a third axis: a few numpy operations instead of two dozen."""
    if ASM:
        r0, r1 = tl.inline_asm_elementwise(_DP4A2_ASM, "=r,=r,r,r,r,r,r", [a0, a1, b, c0, c1],
                                           dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:  # in int64, which the interpreter does not check for overflow (it does int32 adds and products)
        sh = 8 * tl.arange(0, 4).to(tl.int64)[None, None, :]
        bb = (b.to(tl.int64)[:, :, None] << (56 - sh)) >> 56  # [R, 2, 4] signed bytes
        r0 = (c0.to(tl.int64) + tl.sum(((a0.to(tl.int64)[:, :, None] >> sh) & 255) * bb, axis=2)).to(tl.int32)
        r1 = (c1.to(tl.int64) + tl.sum(((a1.to(tl.int64)[:, :, None] >> sh) & 255) * bb, axis=2)).to(tl.int32)
    return r0, r1


@triton.jit
def _dp2a(a, b, c, HI: tl.constexpr, ASM: tl.constexpr):
    """int32 a (two int16 halves), b (four int8 bytes), c -> c + a.lo16 b.byte(2 HI) + a.hi16 b.byte(2 HI + 1)."""
    if ASM:
        if HI:
            r = tl.inline_asm_elementwise("dp2a.hi.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("dp2a.lo.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                          is_pure=True, pack=1)
    else:  # int64: see _dp4a2
        a64 = a.to(tl.int64)
        b64 = b.to(tl.int64)
        lo = (a64 << 48) >> 48
        hi = (a64 << 32) >> 48
        b0 = (b64 << (40 - 16 * HI)) >> 56
        b1 = (b64 << (32 - 16 * HI)) >> 56
        r = (c.to(tl.int64) + lo * b0 + hi * b1).to(tl.int32)
    return r


@triton.jit
def _funnel(a, b, ASM: tl.constexpr):
    """The word 2 bytes into the pair of words (a, b): a's high half, then b's low half."""
    if ASM:
        r = tl.inline_asm_elementwise(_FUNNEL_ASM, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = ((a >> 16) & 0xFFFF) | (b << 16)
    return r


@triton.jit
def _run4(W, off, k: tl.constexpr, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """Words k .. k + 3 of a block at word offset off (tensor) of the aligned memory: loaded (even block),
    or (SHIFTED: the odd block, 2 bytes past off) rebuilt from aligned words k .. k + 4 (five loads)."""
    a0 = tl.load(W + off + k)
    a1 = tl.load(W + off + k + 1)
    a2 = tl.load(W + off + k + 2)
    a3 = tl.load(W + off + k + 3)
    if SHIFTED:
        a4 = tl.load(W + off + k + 4)
        a0 = _funnel(a0, a1, ASM)
        a1 = _funnel(a1, a2, ASM)
        a2 = _funnel(a2, a3, ASM)
        a3 = _funnel(a3, a4, ASM)
    return a0, a1, a2, a3


@triton.jit
def _scale_words(W, off, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """The block's scale words 24..26 and its d as fp32, from aligned words 24..27 (SHIFTED: the odd
    block, whose d is the high half of aligned word 27: it reads nothing past its pair)."""
    a0 = tl.load(W + off + 24)
    a1 = tl.load(W + off + 25)
    a2 = tl.load(W + off + 26)
    a3 = tl.load(W + off + 27)
    if SHIFTED:
        a0 = _funnel(a0, a1, ASM)
        a1 = _funnel(a1, a2, ASM)
        a2 = _funnel(a2, a3, ASM)
        a3 = a3 >> 16
    return a0, a1, a2, half_low(a3)


@triton.jit
def _split4(t):
    """[2, R, 4] -> its four [2, R] slices along the last axis (in registers: the axis is a thread's own)."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 2, 2)))  # elements 0, 2 and 1, 3
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _x_words(XQ, xw, BLOCK_N: tl.constexpr):
    """The four x words xw + i (xw [2, 1]: a multiple of 4 for each half h) as [2, BLOCK_N] tensors, read
    as one 16-byte vector a thread ([2, BLOCK_N, 4], every row the same) and split in registers."""
    i4 = tl.arange(0, 4)[None, None, :]
    return _split4(tl.load(tl.broadcast_to(XQ + xw[:, :, None] + i4, (2, BLOCK_N, 4))))


@triton.jit
def _dx_block(XD, blk, BLOCK_N: tl.constexpr):
    """dx of the block's eight 32-groups as [2, BLOCK_N] fp32 tensors (two 16-byte vectors a thread)."""
    i4 = tl.arange(0, 4)[None, None, :]
    d0, d1, d2, d3 = _split4(tl.load(tl.broadcast_to(XD + blk * 8 + i4, (2, BLOCK_N, 4))))
    d4, d5, d6, d7 = _split4(tl.load(tl.broadcast_to(XD + blk * 8 + 4 + i4, (2, BLOCK_N, 4))))
    return d0, d1, d2, d3, d4, d5, d6, d7


@triton.jit
def _scale_pair(s0, s1, s2, k: tl.constexpr):
    """The scales of 32-groups G = 2 k (byte 0) and 2 k + 1 (byte 2) for the thread's half h, from the
    scale words s0..s2 shifted right by 8 h: 16-group 2 G + h has its low 4 bits in nibble k // 2 of
    byte 2 (G % 2) of s0 (k even) or s1, its high 2 bits in bits 2 k of byte 2 (G % 2) of s2. Each byte
    holds (sc ^ 32) << 2, i.e. 4 (sc - 32) as an int8 (bytes 1, 3 zero): dp2a's operand."""
    sw = s0 if k % 2 == 0 else s1
    u = ((sw >> (4 * (k // 2))) & 0x000F000F) | (((s2 >> (2 * k)) & 0x00030003) << 4)
    return (u ^ 0x00200020) << 2


@triton.jit
def _isum(dq, dh, G: tl.constexpr):
    """sum_l q_l x_l of a 16-group from dq = 4^s sum low2 x and dh = 2^G sum hn x (G = 4 c + s): exact."""
    s = G % 4
    if G < 4:  # 4^s isum = dq - 2^(s + 2) dh
        r = dq - dh * (1 << (s + 2))
        if s > 0:
            r = r >> (2 * s)
    elif s < 3:  # 2^(G - 2) isum = 2^(G - 2 - 2 s) dq - dh
        r = (dq * (1 << (G - 2 - 2 * s)) - dh) >> (G - 2)
    else:  # 64 isum = dq - 2 dh
        r = (dq - dh * 2) >> 6
    return r


@triton.jit
def _block_dot(XQ, XD, W, bw, xo, blk, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """[BLOCK_N, 2] fp32: block blk's share of y, per (row, half h). bw [BLOCK_N, 2]: word offset of the
    block in the aligned memory (SHIFTED: the block starts 2 bytes past it) plus 4 h; xo [1, 2]: 4 h."""
    h0, h1, h2, h3 = _run4(W, bw, 0, SHIFTED, ASM)  # hmask words 4 h + i
    s0, s1, s2, d = _scale_words(W, bw - xo, SHIFTED, ASM)  # the same words for both halves
    hsh = 2 * xo  # 8 h: the thread's scale bytes to bytes 0 and 2
    s0 = s0 >> hsh
    s1 = s1 >> hsh
    s2 = s2 >> hsh
    dx0, dx1, dx2, dx3, dx4, dx5, dx6, dx7 = _dx_block(XD, blk, bw.shape[1])
    acc = tl.zeros(bw.shape, dtype=tl.float32)
    for c in tl.static_range(2):
        q0, q1, q2, q3 = _run4(W, bw, 8 + 8 * c, SHIFTED, ASM)  # qs words 8 + 8 c + 4 h + i
        for s in tl.static_range(4):
            G = 4 * c + s
            if s < 3:
                qm = 0x03030303 << (2 * s)
            else:
                qm = -0x3F3F3F40  # 0xC0C0C0C0 as an int32
            if G < 7:
                hm = 0x01010101 << G
            else:
                hm = -0x7F7F7F80  # 0x80808080
            x0, x1, x2, x3 = _x_words(XQ, blk * 64 + 8 * G + xo, bw.shape[1])  # x words 8 G + 4 h + i
            dq = tl.zeros(bw.shape, dtype=tl.int32)
            dh = tl.zeros(bw.shape, dtype=tl.int32)
            for i in tl.static_range(4):
                q = q0 if i == 0 else q1 if i == 1 else q2 if i == 2 else q3
                hw = h0 if i == 0 else h1 if i == 1 else h2 if i == 2 else h3
                xw = x0 if i == 0 else x1 if i == 1 else x2 if i == 2 else x3
                dq, dh = _dp4a2(q & qm, ~hw & hm, xw, dq, dh, ASM)
            if s % 2 == 0:
                sc = _scale_pair(s0, s1, s2, G // 2)
            # 4 (sc - 32) isum + 0x4B400000 read as fp32 (dp4a_q4k.exact_float): |4 (sc - 32) isum| <= 4 * 32 * 8128 < 2^22
            v = _dp2a(_isum(dq, dh, G), sc, 0x4B400000, G % 2, ASM).to(tl.float32, bitcast=True) - 12582912.0
            dxg = dx0 if G == 0 else dx1 if G == 1 else dx2 if G == 2 else dx3 if G == 3 else dx4 if G == 4 else dx5 if G == 5 else dx6 if G == 6 else dx7
            acc += v * dxg
    return acc * (d * 0.25)  # the scale bytes are 4 (sc - 32)


@triton.jit
def q3k_dp4a_kernel(XQ, XD, W, Y, P, N, ROW_WORDS, PPS: tl.constexpr, BLOCK_N: tl.constexpr,
                    UNROLL: tl.constexpr, PARTIAL: tl.constexpr, ASM: tl.constexpr):
    """Y [N] = x @ dequant(W)^T for BLOCK_N rows over PPS pairs of blocks (PARTIAL: the fp32 partial P
    [SPLIT, N]); x as XQ (int8 as int32 words [K / 4]) and XD (fp32 [K / 32]). W: the Q3_K blocks as
    int32 words [N, ROW_WORDS] (an even number of blocks a row). PPS % UNROLL == 0."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    xo = 4 * tl.arange(0, 2)[:, None]  # [2, 1]: the half h of each 32-group, as a word offset 4 h
    # [2, BLOCK_N] (h first: a warp then spans 16 rows x both halves); rows past N read row N - 1
    bw = tl.minimum(rows, N - 1).to(tl.int64)[None, :] * ROW_WORDS + xo
    acc = tl.zeros([2, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, PPS, UNROLL):
        for u in tl.static_range(UNROLL):
            pair = part * PPS + p0 + u
            pw = bw + pair * PAIR_WORDS
            acc += _block_dot(XQ, XD, W, pw, xo, 2 * pair, False, ASM)
            acc += _block_dot(XQ, XD, W, pw + ODD_WORD, xo, 2 * pair + 1, True, ASM)
    y = tl.sum(acc, axis=0)
    if PARTIAL:
        tl.store(P + part * N + rows, y, mask=rows < N)
    else:
        tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=rows < N)


def dp4a_q3k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Q4kDp4aConfig, asm: bool) -> torch.Tensor:
    """out [1, N] = x [1, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32, for Q3_K
    blocks uint8 [N, K / 256 * 110] (contiguous, K / 256 even). asm: dp4a in inline PTX (CUDA); False under
    the interpreter. Rows of an odd number of blocks raise ValueError (not word-aligned in pairs)."""
    n, nb = blocks.shape[0], k // 256
    if k % 256 or nb % 2 or blocks.shape[1] != nb * BLOCK_BYTES:
        raise ValueError(f"dp4a_q3k: Q3_K blocks {tuple(blocks.shape)} for K = {k}: needs K a multiple of 512 "
                         f"(an even number of 110-byte blocks a row, word-aligned in pairs), got {nb} blocks")
    if x.shape[0] != 1:
        raise ValueError(f"dp4a_q3k: M == 1 only, got x {tuple(x.shape)}")
    xq, dx, _ = quantize_x(x)
    words = blocks.view(torch.int32)  # [N, nb * 27.5]
    programs = triton.cdiv(n, cfg.block_n)
    split = split_for(nb // 2, programs, cfg.min_programs)
    pps = nb // 2 // split
    unroll = cfg.unroll if pps % cfg.unroll == 0 else 1
    part = out if split == 1 else torch.empty(split, n, dtype=torch.float32, device=x.device)  # [SPLIT, N] fp32
    q3k_dp4a_kernel[(programs, split)](xq.view(torch.int32), dx, words, out, part, n, words.shape[1], PPS=pps,
                                       BLOCK_N=cfg.block_n, UNROLL=unroll, PARTIAL=split > 1, ASM=asm,
                                       num_warps=cfg.num_warps)
    if split > 1:
        split_sum_kernel[(triton.cdiv(n, 1024),)](part, out, n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out


__all__ = ["QX_GROUP", "dp4a_q3k", "dp4a_q3k_ref", "q3k_fields", "quantize_x_ref"]
