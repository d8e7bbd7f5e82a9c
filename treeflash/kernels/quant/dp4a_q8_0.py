"""Q8_0 at M == 1 as integer dot products (dp4a), x rounded to 8 bits per group of 32 as in dp4a_q4k.

ggml's block_q8_0 (34 bytes, 32 values): d (fp16), then qs[32] (int8); w = d q. With x's groups of 32
matching the blocks, y = sum_b d_b dx_b sum_l q_l xq_l: one `dp4a.s32.s32` per four values, the
integer sum exact, one multiply-add per block.

Alignment: 34 bytes is not a multiple of 4: the blocks of a row are word-aligned in pairs (68 bytes =
17 words; rows of an even number of blocks start word-aligned in a contiguous tensor). The even block's
d is the low half of word 0 and its codes (bytes 2..33) are rebuilt from neighbouring words; the odd
block's d is the high half of word 8 and its codes are words 9..16 as they are. Rows of an odd number
of blocks are refused (quant_matmul routes them to the generic GEMV).

The Q8_0 matrices of the 27B Q4_K_M mix are the Gated DeltaNet's alpha / beta projections (2 x 48 rows):
the generic GEMV ran them as 6 programs walking all of K, 74 us a layer, a quarter of the decode step
(bench/results/profile_27b_q4_k_m.json before this kernel). Here the split over K (pairs, as in
dp4a_q4k) spreads a narrow matrix over the whole GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Dp4aConfig, split_for
from treeflash.kernels.quant.dp4a_q4k import exact_float, quantize_x, quantize_x_ref
from treeflash.kernels.quant.split_k import finish_split, finish_unfused, split_buffers
from treeflash.kernels.quant.q4k_block import half_low

PAIR_WORDS = tl.constexpr(17)  # two Q8_0 blocks: 68 bytes


def dp4a_q8_0_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None,
                  quantized: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """What q8_0_dp4a_kernel computes, in plain torch: x [M, K] rounded as quantize_x_ref does (or as
    `quantized` gives it) against Q8_0 blocks uint8 [N, K / 32 * 34]; integer sums exact, the rest fp64."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 32
    xq, dx, _ = quantized if quantized is not None else quantize_x_ref(x)
    raw = blocks.reshape(n, nb, 34)
    d = raw[..., 0:2].contiguous().view(torch.float16).double().reshape(n, nb)
    q = raw[..., 2:].contiguous().view(torch.int8).long()  # [N, nb, 32]
    isum = torch.einsum("nbl,mbl->mnb", q, xq.long().reshape(m, nb, 32)).double()  # exact [M, N, blocks]
    return (isum * d[None] * dx.double()[:, None, :]).sum(-1).to(out_dtype or x.dtype)


_DP4A_ASM = tl.constexpr("dp4a.s32.s32 $0, $1, $2, 0;")


@triton.jit
def _dp4a_ss(a, b, ASM: tl.constexpr):
    """Words a, b of four signed bytes each (same shape) -> sum_i a_i b_i (int32)."""
    if ASM:
        r = tl.inline_asm_elementwise(_DP4A_ASM, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = tl.zeros_like(a)
        for i in tl.static_range(4):
            r += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
    return r


@triton.jit
def q8_0_dp4a_kernel(XQ, XD, W, Y, P, CNT, N, ROW_WORDS, PPS: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLIT: tl.constexpr, ASM: tl.constexpr,
                    FUSED: tl.constexpr = True):
    """Y [N] = x @ dequant(W)^T for BLOCK_N rows over PPS pairs of blocks (SPLIT > 1: split_k.finish_split over
    P [SPLIT, N] and CNT); x as XQ (int8 as int32 words [K / 4]) and XD (fp32 [K / 32]). W: the Q8_0 blocks as
    int32 words [N, ROW_WORDS]. One row a thread: every tensor is [BLOCK_N] (or [BLOCK_N, 8] words)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    part = tl.program_id(1)
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS  # rows past N read row N - 1
    jj = tl.arange(0, 8)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p in range(PPS):
        pair = part * PPS + p
        pw = row_w + pair * PAIR_WORDS  # [BLOCK_N] the pair's first word
        lo = tl.load(W + pw[:, None] + jj[None, :])  # [BLOCK_N, 8] words 0..7
        hi = tl.load(W + pw[:, None] + (jj + 1)[None, :])  # words 1..8
        even = ((lo >> 16) & 0xFFFF) | (hi << 16)  # the even block's codes: bytes 2..33
        odd = tl.load(W + pw[:, None] + (jj + 9)[None, :])  # the odd block's codes: words 9..16
        x0 = tl.load(XQ + 16 * pair + jj)  # [8] x words of block 2 pair
        x1 = tl.load(XQ + 16 * pair + 8 + jj)
        i0 = tl.sum(_dp4a_ss(even, tl.broadcast_to(x0[None, :], (BLOCK_N, 8)), ASM), axis=1)  # |i| <= 32 127^2 < 2^22
        i1 = tl.sum(_dp4a_ss(odd, tl.broadcast_to(x1[None, :], (BLOCK_N, 8)), ASM), axis=1)
        d0 = half_low(tl.load(W + pw))
        d1 = half_low(tl.load(W + pw + 8) >> 16)
        acc += d0 * (exact_float(i0) * tl.load(XD + 2 * pair)) + d1 * (exact_float(i1) * tl.load(XD + 2 * pair + 1))
    finish_split(acc, rows, rows < N, Y, P, CNT, N, part, tl.program_id(0), SPLIT, ASM, FUSED)


def dp4a_q8_0(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Dp4aConfig, asm: bool,
              counters: torch.Tensor | None = None) -> torch.Tensor:
    """out [1, N] = x [1, K] (contiguous) @ dequant(blocks)^T, x rounded to 8 bits per group of 32, for Q8_0
    blocks uint8 [N, K / 32 * 34] (contiguous, K / 32 even). asm: dp4a in inline PTX (CUDA)."""
    n, nb = blocks.shape[0], k // 32
    if nb % 2:
        raise ValueError(f"dp4a_q8_0: rows of {nb} blocks (K = {k}) are not word-aligned in pairs")
    xq, dx, _ = quantize_x(x)
    words = blocks.view(torch.int32)  # [N, nb * 8.5]
    programs = triton.cdiv(n, cfg.block_n)
    split = split_for(nb // 2, programs, cfg.min_programs)
    part, cnt = split_buffers(n, split, programs, out, counters)  # [SPLIT, N] fp32 partials
    q8_0_dp4a_kernel[(programs, split)](xq.view(torch.int32), dx, words, out, part, cnt, n, words.shape[1], PPS=nb // 2 // split,
                                        BLOCK_N=cfg.block_n, SPLIT=split, ASM=asm, FUSED=cfg.fused_split, num_warps=cfg.num_warps)
    finish_unfused(part, out, n, split, cfg.fused_split)
    return out
