"""Q6_K at M == 1 as integer dot products (dp4a), x rounded to 8 bits per group of 32 as in dp4a_q4k.

ggml's block_q6_K (210 bytes, 256 values): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16]
(int8, one per 16 values), d (fp16). Half n (values 128n ..) takes ql[64n : 64n + 64] and
qh[32n : 32n + 32]; for l = 0..31 and A = ql[64n + l], B = ql[64n + 32 + l], H = qh[32n + l]:

    value 128n + l       : (A & 15) | (H & 3) << 4          value 128n + 64 + l : A >> 4 | (H >> 4 & 3) << 4
    value 128n + 32 + l  : (B & 15) | (H >> 2 & 3) << 4     value 128n + 96 + l : B >> 4 | (H >> 6 & 3) << 4

each a code q' in 0..63 for the weight d sc (q' - 32). Read as 32-bit words (four l at once) a code
word costs two to three logic operations, and its dot with four int8 x values one `dp4a.u32.s32`; the
-32 comes back per 16 values as -32 * sum(xq) (a dp4a of the x words against 0x01010101). Per group
of 16 the integer sum is exact; scaled by sc (int), the two halves of a 32-group are added in int32,
converted once, multiplied by dx and, after the block, by d.

Alignment: 210 bytes is not a multiple of 4, so the blocks of a row are word-aligned in pairs (420
bytes = 105 words; a row of an even number of blocks starts word-aligned in a contiguous tensor): a
pair's even block reads its words directly, the odd one (at byte 210 = word 52 + 2) rebuilds each
word from the two around it. Rows of an odd number of blocks are refused (quant_matmul routes them
to rows_q6k).

Split over K (narrow N) as in dp4a_q4k, over pairs. Under the interpreter (ASM False) dp4a is plain
integer arithmetic on the four bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Dp4aConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import QX_GROUP, exact_float, quantize_x, quantize_x_ref
from treeflash.kernels.quant.q4k_block import half_low
from treeflash.kernels.quant.split_k import finish_split, finish_unfused, split_buffers

PAIR_WORDS = tl.constexpr(105)  # two Q6_K blocks: 420 bytes


def q6k_fields(blocks: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K blocks uint8 [N, K / 256 * 210] -> (d fp64 [N, K / 256], scales int64 [N, K / 16],
    codes q' int64 [N, K / 16, 16] in 0..63): the weight of value l of 16-group g is d sc_g (q'_l - 32)."""
    n, nb = blocks.shape[0], k // 256
    raw = blocks.reshape(n, nb, 210)
    d = raw[..., 208:210].contiguous().view(torch.float16).double().reshape(n, nb)
    sc = raw[..., 192:208].contiguous().view(torch.int8).long().reshape(n, nb * 16)
    ql = raw[..., 0:128].long().reshape(n, nb, 2, 2, 32)  # [N, nb, half, A/B, l]
    qh = raw[..., 128:192].long().reshape(n, nb, 2, 1, 32)  # [N, nb, half, 1, l]
    lo = torch.cat([ql & 15, ql >> 4], dim=3)  # [N, nb, half, 4, l]: quarters t = 0 (A low), 1 (B low), 2 (A high), 3 (B high)
    hi = torch.cat([qh & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3], dim=3)
    return d, sc, (lo | hi << 4).reshape(n, nb * 16, 16)


def dp4a_q6k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                 quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """What q6k_dp4a_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as
    `quantized` gives it), against Q6_K blocks uint8 [N, K / 256 * 210]; the integer sums exact, the
    rest in fp64 -> [M, N]."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    xq, dx, _ = quantized if quantized is not None else quantize_x_ref(x)
    d, sc, q = q6k_fields(blocks, k)
    isum = torch.einsum("ngl,mgl->mng", q - 32, xq.long().reshape(m, nb * 16, 16))  # exact [M, N, groups of 16]
    per32 = (isum * sc[None]).reshape(m, n, nb * 8, 2).sum(-1).double()  # [M, N, groups of 32]
    y = (per32 * dx.double()[:, None, :]).reshape(m, n, nb, 8).sum(-1)
    return (y * d[None]).sum(-1).to(out_dtype or x.dtype)


_DP4A_ASM = tl.constexpr("dp4a.u32.s32 $0, $1, $2, 0;")
_XSUM_ASM = tl.constexpr("dp4a.s32.s32 $0, $1, 0x01010101, 0;")


@triton.jit
def _dp4a(a, b, ASM: tl.constexpr):
    """Words a (four unsigned bytes) and b (four signed bytes), same shape -> sum_i a_i b_i (int32)."""
    if ASM:
        r = tl.inline_asm_elementwise(_DP4A_ASM, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = tl.zeros_like(a)
        for i in tl.static_range(4):
            r += ((a >> (8 * i)) & 255) * ((b << (24 - 8 * i)) >> 24)
    return r


@triton.jit
def _xsum(b, ASM: tl.constexpr):
    """Words of four signed bytes -> their sum (int32)."""
    if ASM:
        r = tl.inline_asm_elementwise(_XSUM_ASM, "=r,r", [b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = tl.zeros_like(b)
        for i in tl.static_range(4):
            r += (b << (24 - 8 * i)) >> 24
    return r


@triton.jit
def _word(W, off, i: tl.constexpr, SHIFTED: tl.constexpr):
    """Word i [BLOCK_N] of a block at word offsets off [BLOCK_N] of an even block, or (SHIFTED) of the odd
    block of a pair: its word i is the high half of word i and the low half of word i + 1 of the aligned
    memory (the same loads serve neighbouring words: the compiler keeps one of each)."""
    if SHIFTED:
        return ((tl.load(W + off + i) >> 16) & 0xFFFF) | (tl.load(W + off + i + 1) << 16)
    else:
        return tl.load(W + off + i)


@triton.jit
def _block_dot(XQ, XD, W, bw, blk, d, BLOCK_N: tl.constexpr, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """[BLOCK_N] fp32: block blk's share of y; bw [BLOCK_N] the word offset of its first word (aligned
    memory; SHIFTED: 2 bytes past it), d [BLOCK_N] its fp16 scale as fp32. Every tensor is one value a
    row ([BLOCK_N]): a thread owns its rows, so nothing is reduced across threads."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for n in tl.static_range(2):
        sc_lo = _word(W, bw, 48 + 2 * n, SHIFTED)  # scales 8n .. 8n + 3
        sc_hi = _word(W, bw, 49 + 2 * n, SHIFTED)  # scales 8n + 4 .. 8n + 7
        for t in tl.static_range(4):  # quarter t: values 128n + 32t + l, one 32-group of x
            per32 = tl.zeros([BLOCK_N], dtype=tl.int32)
            for s in tl.static_range(2):  # l = 16s .. 16s + 15: the 16-group of scale 8n + 2t + s
                isum = tl.zeros([BLOCK_N], dtype=tl.int32)
                xsum = 0
                for jj in tl.static_range(4):
                    j = 4 * s + jj  # word j of each 32-byte run: l = 4j .. 4j + 3
                    if t == 0 or t == 2:
                        a = _word(W, bw, 16 * n + j, SHIFTED)  # ql[64n + l]
                    else:
                        a = _word(W, bw, 16 * n + 8 + j, SHIFTED)  # ql[64n + 32 + l]
                    h = _word(W, bw, 32 + 8 * n + j, SHIFTED)  # qh[32n + l]
                    if t == 0:
                        q = (a & 0x0F0F0F0F) | ((h << 4) & 0x30303030)
                    elif t == 1:
                        q = (a & 0x0F0F0F0F) | ((h << 2) & 0x30303030)
                    elif t == 2:
                        q = ((a >> 4) & 0x0F0F0F0F) | (h & 0x30303030)
                    else:
                        q = ((a >> 4) & 0x0F0F0F0F) | ((h >> 2) & 0x30303030)
                    xw = tl.load(XQ + blk * 64 + 32 * n + 8 * t + j)  # the int8 x word of values 128n + 32t + 4j ..
                    isum += _dp4a(q, tl.broadcast_to(xw, (BLOCK_N,)), ASM)
                    xsum += _xsum(xw, ASM)
                k = 2 * t + s  # scale 8n + k: byte k % 4 of sc_lo / sc_hi, sign-extended
                scw = sc_lo if k < 4 else sc_hi
                per32 += ((scw << (24 - 8 * (k % 4))) >> 24) * (isum - 32 * xsum)  # |isum - 32 xsum| <= 193,040
            acc += per32.to(tl.float32) * tl.load(XD + blk * 8 + 4 * n + t)
    return d * acc


@triton.jit
def q6k_dp4a_kernel(XQ, XD, W, Y, P, CNT, N, ROW_WORDS, PPS: tl.constexpr, BLOCK_N: tl.constexpr,
                    SPLIT: tl.constexpr, ASM: tl.constexpr,
                    FUSED: tl.constexpr = True):
    """Y [N] = x @ dequant(W)^T for BLOCK_N rows over PPS pairs of blocks (SPLIT > 1: split_k.finish_split
    over P [SPLIT, N] and CNT); x as XQ (int8 as int32 words [K / 4]) and XD (fp32 [K / 32]). W: the Q6_K
    blocks as int32 words [N, ROW_WORDS] (an even number of blocks a row)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS  # rows past N read row N - 1
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p in range(PPS):
        pair = part * PPS + p
        pw = row_w + pair * PAIR_WORDS  # [BLOCK_N] the pair's first word
        end = tl.load(W + pw + 104)  # the odd block's d (high half); the even one's is word 52's low half
        acc += _block_dot(XQ, XD, W, pw, 2 * pair, half_low(tl.load(W + pw + 52)), BLOCK_N, False, ASM)
        acc += _block_dot(XQ, XD, W, pw + 52, 2 * pair + 1, half_low(end >> 16), BLOCK_N, True, ASM)
    finish_split(acc, rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


@triton.jit
def _lane_word(W, off, SHIFTED: tl.constexpr):
    """The words at offsets off of aligned memory, or (SHIFTED) the words 2 bytes past them."""
    if SHIFTED:
        return ((tl.load(W + off) >> 16) & 0xFFFF) | (tl.load(W + off + 1) << 16)
    else:
        return tl.load(W + off)


@triton.jit
def _dp4a_acc(a, b, c, ASM: tl.constexpr):
    """c + sum_i a_i b_i over the four bytes (a unsigned, b signed), int32 tensors of one shape."""
    if ASM:
        r = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                      is_pure=True, pack=1)
    else:
        r = c
        for i in tl.static_range(4):
            r += ((a >> (8 * i)) & 255) * ((b << (24 - 8 * i)) >> 24)
    return r


@triton.jit
def _block_lanes(XQ, XS4, XD, W, bw, w, blk, SHIFTED: tl.constexpr, ASM: tl.constexpr):
    """[BLOCK_N, 32] fp32: block blk's share of y / d per row and ql word w [1, 32] (bw [BLOCK_N, 1]: the
    block's first word in aligned memory; SHIFTED: 2 bytes past it). ql word w = 16n + 8p + 4s + j holds
    ql[64n + 32p + 16s + 4j ..]: with qh word 32 + 8n + 4s + j it gives the codes of quarter t = p (low
    nibbles) and t = p + 2 (high nibbles), 16-group s of each. A row's 32 words are contiguous along w, so
    one warp load reads 128 contiguous bytes."""
    n = w // 16
    p = (w // 8) % 2
    byte = 8 * ((w // 4) % 4)  # scale 8n + 2p + s: byte 2p + s of word 48 + 2n (quarter p), of 49 + 2n (p + 2)
    sc_a = (_lane_word(W, bw + 48 + 2 * n, SHIFTED) << (24 - byte)) >> 24  # signed
    sc_b = (_lane_word(W, bw + 49 + 2 * n, SHIFTED) << (24 - byte)) >> 24
    a = _lane_word(W, bw + w, SHIFTED)
    h = _lane_word(W, bw + 32 + 8 * n + w % 8, SHIFTED) >> (2 * p)  # the qh bits of quarter p at bits 0-1, 4-5
    lo = (a & 0x0F0F0F0F) | ((h << 4) & 0x30303030)
    hi = ((a >> 4) & 0x0F0F0F0F) | (h & 0x30303030)
    xw = blk * 64 + 32 * n + w % 16  # [1, 32] the x word of quarter p's values (+ 16: of quarter p + 2)
    # q' - 32: dp4a starts from -32 times the x word's sum of xq
    il = _dp4a_acc(lo, tl.load(XQ + xw), -32 * tl.load(XS4 + xw), ASM)
    ih = _dp4a_acc(hi, tl.load(XQ + xw + 16), -32 * tl.load(XS4 + xw + 16), ASM)
    xd = blk * 8 + 4 * n + p  # [1, 32] the 32-group of quarter p (+ 2: of quarter p + 2)
    # |sc (sum of 4 (q' - 32) xq)| <= 128 4 32 127 < 2^22: exact_float's range
    return exact_float(sc_a * il) * tl.load(XD + xd) + exact_float(sc_b * ih) * tl.load(XD + xd + 2)


@triton.jit
def q6k_lanes_kernel(XQ, XS4, XD, W, Y, P, CNT, N, ROW_WORDS, PPS: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLIT: tl.constexpr, ASM: tl.constexpr,
                    FUSED: tl.constexpr = True):
    """q6k_dp4a_kernel's result with 32 threads a row: a warp's load reads 128 contiguous bytes of one row
    (one row a thread reads 32 rows' words, 4 bytes each, per load). x also as XS4 (int32 [K / 4], the sums
    of xq per word). Accumulated per (row, word) in fp32, added once at the end."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    w = tl.arange(0, 32)[None, :]  # [1, 32]
    row_w = (tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS)[:, None]  # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_N, 32], dtype=tl.float32)
    for q in range(PPS):
        pair = part * PPS + q
        pw = row_w + pair * PAIR_WORDS  # [BLOCK_N, 1]
        d0 = half_low(tl.load(W + pw + 52))  # the even block's d: word 52's low half
        d1 = half_low(tl.load(W + pw + 104) >> 16)  # the odd one's: word 104's high half
        acc += d0 * _block_lanes(XQ, XS4, XD, W, pw, w, 2 * pair, False, ASM)
        acc += d1 * _block_lanes(XQ, XS4, XD, W, pw + 52, w, 2 * pair + 1, True, ASM)
    finish_split(tl.sum(acc, axis=1), rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


def dp4a_q6k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Dp4aConfig, asm: bool,
             lanes: bool = False, counters: torch.Tensor | None = None) -> torch.Tensor:
    """out [1, N] = x [1, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32, for Q6_K
    blocks uint8 [N, K / 256 * 210] (contiguous, K / 256 even). asm: dp4a in inline PTX (CUDA). lanes:
    q6k_lanes_kernel (32 threads a row) instead of one row a thread. counters: split_k's, kept by the caller."""
    n, nb = blocks.shape[0], k // 256
    if nb % 2:
        raise ValueError(f"dp4a_q6k: rows of {nb} blocks (K = {k}) are not word-aligned in pairs")
    words = blocks.view(torch.int32)  # [N, nb * 52.5]
    programs = triton.cdiv(n, cfg.block_n)
    split = split_for(nb // 2, programs, cfg.min_programs)
    part, cnt = split_buffers(n, split, programs, out, counters)  # [SPLIT, N] fp32 partials
    if lanes:
        xq, dx, _, s4 = quantize_x(x, sums=4)
        q6k_lanes_kernel[(programs, split)](xq.view(torch.int32), s4, dx, words, out, part, cnt, n, words.shape[1],
                                            PPS=nb // 2 // split, BLOCK_N=cfg.block_n, SPLIT=split, ASM=asm, FUSED=cfg.fused_split,
                                            num_warps=cfg.num_warps)
    else:
        xq, dx, _ = quantize_x(x)
        q6k_dp4a_kernel[(programs, split)](xq.view(torch.int32), dx, words, out, part, cnt, n, words.shape[1],
                                           PPS=nb // 2 // split, BLOCK_N=cfg.block_n, SPLIT=split, ASM=asm, FUSED=cfg.fused_split,
                                           num_warps=cfg.num_warps)
    finish_unfused(part, out, n, split, cfg.fused_split)
    return out


__all__ = ["QX_GROUP", "dp4a_q6k", "dp4a_q6k_ref", "q6k_fields", "quantize_x_ref"]
