"""Q3_K at M == 1 as integer dot products (dp4a), x rounded to 8 bits per group of 32 as in dp4a_q4k.

x is quantized once per call by dp4a_q4k.quantize_x: xq int8 [1, K] (read as int32 words [K / 4]), dx fp32
[1, K / 32]; the exact group sums are not needed. ggml's block_q3_K (110 bytes, 256 values; reference.py's
_q3_k):

    hmask[32]   bytes   0..31    words  0..7    bit G of byte j: the high bit of value 32 G + j
    qs[64]      bytes  32..95    words  8..23   byte 32 c + j, bits 2 s, 2 s + 1: the low 2 bits of value 128 c + 32 s + j
    scales[12]  bytes  96..107   words 24..26   6-bit scale of 16-group g: low 4 bits nibble g // 8 of byte g % 8,
                                                high 2 bits bits 2 (g // 4) of byte 8 + g % 4; the scale is that - 32
    d           bytes 108..109   word 27 (low half), fp16

The weight of value e = 32 G + j (32-group G = 4 c + s, j = 0..31; 16-group g = 2 G + j // 16) is
d (sc_g - 32) q, q = low2 - 4 hn in [-4, 3], hn = 1 - (hmask bit): a clear bit means -4.

Threads: one (half h = j // 16, row) each; every tensor is [2, BLOCK_N] (h first, so a warp's load covers
16 rows x both halves: few cache lines a load, and every sum over a 16-group stays in its thread). Of each
block a thread reads hmask words 4 h + i and qs words 8 + 8 c + 4 h + i (i = 0..3, one 4-byte load each),
the three scale words and d; of x, words 8 G + 4 h + i (one 16-byte load a 32-group) and dx (two 16-byte
loads a block). Per word and 32-group: two masks and two `dp4a.u32.s32`, chained over the four words:

    dq = sum_i dp4a(qs_i & (0x03030303 << 2 s), x_i) = 4^s sum low2 x
    dh = sum_i dp4a(~hmask_i & (0x01010101 << G), x_i) = 2^G sum hn x

so isum = dq / 4^s - 4 dh / 2^G by exact shifts (no -4 sum(x) term: the -4 rides on the clear bits),
|isum| <= 16 * 4 * 127. The scales are repacked once a block, two 32-groups a word, as bytes
(sc ^ 32) << 2 = 4 (sc - 32) (int8) at bytes 0 and 2, so one `dp2a.lo/hi.s32.s32` of isum (an int16 in
the word's low half) gives 4 (sc - 32) isum + 0x4B400000, which read as fp32 is 1.5 2^23 plus that exact
integer (|.| < 2^22; dp4a_q4k.exact_float): one float subtraction, one FMA with dx, per 16 values. After
the block the sum is multiplied by d / 4; the two halves of a row are added once at the end. SASS (sm_90a,
default config): ~1.8 instructions a weight value, ~1.1 of them the masks and dp4a.

Alignment: 110 bytes is not a multiple of 4, so the blocks of a row are word-aligned in pairs (220 bytes =
55 words; a row of an even number of blocks starts word-aligned in a contiguous tensor): a pair's even
block reads its words directly, the odd one (pair byte 110 = word 27 + 2) rebuilds each word k from the
aligned words 27 + k and 28 + k (`shf.r.clamp` by 16: the high half of one, the low half of the next; five
loads a run of four words) and takes d from the high half of the pair's word 54, reading nothing past its
pair. 55 is odd, so no field is 16-byte aligned in general: the weight loads are 4-byte ones. Rows of an
odd number of blocks (K / 256 odd) raise a ValueError naming the shape (the caller routes them elsewhere).

Split over K (narrow N) as in dp4a_q4k, over pairs: fp32 partials [SPLIT, N] added in order by
the tile's last program (split_k.py); UNROLL pairs a loop step. Under the interpreter (ASM False) dp4a, dp2a and the
funnel shift are plain integer arithmetic (int64: the interpreter checks int32 adds for overflow).
dp4a_q3k_ref states the result in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Dp4aConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import QX_GROUP, quantize_x, quantize_x_ref
from treeflash.kernels.quant.split_k import finish_split, finish_unfused, split_buffers
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


# a 16-group's eight dp4a: two chains over its four words i, $2 + i the masked codes (qs), $6 + i the masked
# cleared high bits (hmask), $10 + i the x words
_GROUP_ASM = tl.constexpr("""{
dp4a.u32.s32 $0, $2, $10, 0;
dp4a.u32.s32 $1, $6, $10, 0;
dp4a.u32.s32 $0, $3, $11, $0;
dp4a.u32.s32 $1, $7, $11, $1;
dp4a.u32.s32 $0, $4, $12, $0;
dp4a.u32.s32 $1, $8, $12, $1;
dp4a.u32.s32 $0, $5, $13, $0;
dp4a.u32.s32 $1, $9, $13, $1;
}""")
_FUNNEL_ASM = tl.constexpr("shf.r.clamp.b32 $0, $1, $2, 16;")


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
def _stack4(t0, t1, t2, t3):
    """Four [2, R] tensors -> [2, R, 4] (the inverse of _split4)."""
    return tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), (t0.shape[0], t0.shape[1], 4))


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
def _group(XQ, xw, q0, q1, q2, q3, h0, h1, h2, h3, sc, G: tl.constexpr, ASM: tl.constexpr):
    """[2, BLOCK_N] fp32, exact: 4 (sc - 32) sum_l q_l xq_l over the thread's 16-group of 32-group G = 4 c + s
    (words q0..q3 of qs chunk c, h0..h3 of hmask, x words xw + i (xw [2, 1]), sc its _scale_pair word)."""
    if (G % 4) < 3:
        qm = 0x03030303 << (2 * (G % 4))
    else:
        qm = -0x3F3F3F40  # 0xC0C0C0C0 as an int32
    if G < 7:
        hm = 0x01010101 << G
    else:
        hm = -0x7F7F7F80  # 0x80808080
    xt = tl.load(tl.broadcast_to(XQ + xw[:, :, None] + tl.arange(0, 4)[None, None, :], (2, q0.shape[1], 4)))  # one 16-byte load
    if ASM:
        x0, x1, x2, x3 = _split4(xt)
        dq, dh = tl.inline_asm_elementwise(
            _GROUP_ASM, "=r,=r,r,r,r,r,r,r,r,r,r,r,r,r",
            [q0 & qm, q1 & qm, q2 & qm, q3 & qm, ~h0 & hm, ~h1 & hm, ~h2 & hm, ~h3 & hm, x0, x1, x2, x3],
            dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:  # the same sums in int64 over [2, BLOCK_N, word, byte] (the interpreter checks int32 adds for overflow)
        sh = 8 * tl.arange(0, 4).to(tl.int64)[None, None, None, :]
        xb = (xt.to(tl.int64)[:, :, :, None] << (56 - sh)) >> 56  # signed bytes
        qb = ((_stack4(q0, q1, q2, q3) & qm).to(tl.int64)[:, :, :, None] >> sh) & 255
        hb = ((~_stack4(h0, h1, h2, h3) & hm).to(tl.int64)[:, :, :, None] >> sh) & 255
        dq = tl.sum(tl.sum(qb * xb, axis=3), axis=2).to(tl.int32)
        dh = tl.sum(tl.sum(hb * xb, axis=3), axis=2).to(tl.int32)
    # dq = 4^s sum low2 x, dh = 2^G sum hn x (s = G % 4): isum = dq / 4^s - 4 dh / 2^G by exact shifts;
    # |isum| <= 16 * 4 * 127
    if G < 4:  # 4^s isum = dq - 2^(s + 2) dh
        isum = dq - dh * (1 << ((G % 4) + 2))
        if (G % 4) > 0:
            isum = isum >> (2 * (G % 4))
    elif (G % 4) < 3:  # 2^(G - 2) isum = 2^(G - 2 - 2 s) dq - dh
        isum = (dq * (1 << (G - 2 - 2 * (G % 4))) - dh) >> (G - 2)
    else:  # 64 isum = dq - 2 dh
        isum = (dq - dh * 2) >> 6
    # dp2a: isum (an int16 in the low half, its sign in the high one) times byte 2 (G % 2) of sc, plus
    # 0x4B400000: read as fp32 that is 1.5 2^23 + 4 (sc - 32) isum (|.| <= 4 * 32 * 8128 < 2^22: exact_float)
    if ASM:
        if G % 2 == 0:
            r = tl.inline_asm_elementwise("dp2a.lo.s32.s32 $0, $1, $2, 1262485504;", "=r,r,r", [isum, sc],
                                          dtype=tl.int32, is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("dp2a.hi.s32.s32 $0, $1, $2, 1262485504;", "=r,r,r", [isum, sc],
                                          dtype=tl.int32, is_pure=True, pack=1)
    else:
        a = isum.to(tl.int64)
        b = sc.to(tl.int64)
        b0 = (b << (56 - 16 * (G % 2))) >> 56  # bytes 2 (G % 2) and 2 (G % 2) + 1, signed
        b1 = (b << (48 - 16 * (G % 2))) >> 56
        r = (((a << 48) >> 48) * b0 + ((a << 32) >> 48) * b1 + 0x4B400000).to(tl.int32)
    return r.to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _block_dot(XQ, XD, W, bw, xo, blk, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """[2, BLOCK_N] fp32: block blk's share of y, per (half h, row). bw [2, BLOCK_N]: word offset of the
    block in the aligned memory (SHIFTED: the block starts 2 bytes past it) plus 4 h; xo [2, 1]: 4 h."""
    h0, h1, h2, h3 = _run4(W, bw, 0, SHIFTED, ASM)  # hmask words 4 h + i
    s0, s1, s2, d = _scale_words(W, bw - xo, SHIFTED, ASM)  # the same words for both halves
    hsh = 2 * xo  # 8 h: the thread's scale bytes to bytes 0 and 2
    s0 = s0 >> hsh
    s1 = s1 >> hsh
    s2 = s2 >> hsh
    i4 = tl.arange(0, 4)[None, None, :]
    dx0, dx1, dx2, dx3 = _split4(tl.load(tl.broadcast_to(XD + blk * 8 + i4, (2, bw.shape[1], 4))))  # 16-byte loads
    dx4, dx5, dx6, dx7 = _split4(tl.load(tl.broadcast_to(XD + blk * 8 + 4 + i4, (2, bw.shape[1], 4))))
    xb = blk * 64 + xo  # [2, 1]: x word 4 h of the block
    q0, q1, q2, q3 = _run4(W, bw, 8, SHIFTED, ASM)  # qs words 8 + 4 h + i: chunk 0, 32-groups 0..3
    sc = _scale_pair(s0, s1, s2, 0)
    acc = _group(XQ, xb, q0, q1, q2, q3, h0, h1, h2, h3, sc, 0, ASM) * dx0
    acc += _group(XQ, xb + 8, q0, q1, q2, q3, h0, h1, h2, h3, sc, 1, ASM) * dx1
    sc = _scale_pair(s0, s1, s2, 1)
    acc += _group(XQ, xb + 16, q0, q1, q2, q3, h0, h1, h2, h3, sc, 2, ASM) * dx2
    acc += _group(XQ, xb + 24, q0, q1, q2, q3, h0, h1, h2, h3, sc, 3, ASM) * dx3
    q0, q1, q2, q3 = _run4(W, bw, 16, SHIFTED, ASM)  # chunk 1: 32-groups 4..7
    sc = _scale_pair(s0, s1, s2, 2)
    acc += _group(XQ, xb + 32, q0, q1, q2, q3, h0, h1, h2, h3, sc, 4, ASM) * dx4
    acc += _group(XQ, xb + 40, q0, q1, q2, q3, h0, h1, h2, h3, sc, 5, ASM) * dx5
    sc = _scale_pair(s0, s1, s2, 3)
    acc += _group(XQ, xb + 48, q0, q1, q2, q3, h0, h1, h2, h3, sc, 6, ASM) * dx6
    acc += _group(XQ, xb + 56, q0, q1, q2, q3, h0, h1, h2, h3, sc, 7, ASM) * dx7
    return acc * (d * 0.25)  # the scale bytes are 4 (sc - 32)


@triton.jit
def q3k_dp4a_kernel(XQ, XD, W, Y, P, CNT, N, ROW_WORDS, PPS: tl.constexpr, BLOCK_N: tl.constexpr,
                    UNROLL: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr,
                    FUSED: tl.constexpr = True):
    """Y [N] = x @ dequant(W)^T for BLOCK_N rows over PPS pairs of blocks (SPLIT > 1: split_k.finish_split over
    P [SPLIT, N] and CNT); x as XQ (int8 as int32 words [K / 4]) and XD (fp32 [K / 32]). W: the Q3_K blocks as
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
    finish_split(y, rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


def dp4a_q3k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Dp4aConfig, asm: bool,
              counters: torch.Tensor | None = None) -> torch.Tensor:
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
    part, cnt = split_buffers(n, split, programs, out, counters)  # [SPLIT, N] fp32 partials
    q3k_dp4a_kernel[(programs, split)](xq.view(torch.int32), dx, words, out, part, cnt, n, words.shape[1], PPS=pps,
                                       BLOCK_N=cfg.block_n, UNROLL=unroll, SPLIT=split, ASM=asm, FUSED=cfg.fused_split,
                                       num_warps=cfg.num_warps)
    finish_unfused(part, out, n, split, cfg.fused_split)
    return out


__all__ = ["QX_GROUP", "dp4a_q3k", "dp4a_q3k_ref", "q3k_fields", "quantize_x_ref"]
