"""Q4_K through the tensor cores with exact codes: the weight's scales applied after the dot.

gemv_q4k and rows_q4k turn every 4-bit code into a weight in fp32 (shift, mask, the 2^23 trick, a
multiply-add by the group's scale and min, then a rounding to bf16 for the dot): about six
operations a value, which at the 27B Q4_K_M shape's ~5.6e12 values/s (85% of the H200's
bandwidth) is more than the SMs' fp32 throughput. Here a code goes into the dot as it is stored:
128 + q is exact in bf16 (bits 0x4300 | q), so the two nibbles of four code bytes become eight
bf16 values with one mask, one shift, one mask and four byte permutes (`prmt` with the constant
byte 0x43, inline PTX; about 0.9 operations a value). The dot of those codes with x, per group g
of 32 values, is C_g = sum (128 + q) x = P_g + 128 s_g (s_g = sum of x over the group), so

    y = sum_g d sc_g P_g - dmin m_g s_g = sum_g d sc_g C_g - (128 d sc_g + dmin m_g) s_g.

Two forms of the per-group scaling (SCALE constexpr):
- "group": one tl.dot of K = 32 per group ([BLOCK_N, 32] codes x [32, BLOCK_M] rows of x), then
  acc += C_g d sc_g - (128 d sc_g + dmin m_g) s_g: two multiply-adds per output per group (1 a value
  at BLOCK_M = 16). Any number of rows of x; every 16-row tile of x is computed alike (BLOCK_M = 16
  makes rows independent of M: row i of a batch equals the same row alone).
- "diag" (M == 1): x as a block-diagonal [32, 16] operand per group (column g holds group g's
  values, the others zero), so the 8 dots of a super-block accumulate into one [BLOCK_N, 16] tile C
  whose column g is C_g; after the block, acc += T (C + V) with T[:, g] = d sc_g, T[:, 8 + g] =
  -dmin m_g and V = (-128 s_g, s_g): sixteen multiply-adds per row per 256 values.

Under the Triton interpreter (ASM False) the codes are built with ordinary integer ops and the dot
is an IEEE fp32 dot (the interpreter's bf16 dot is wrong): 128 + q and bf16 x are exact in fp32,
so that path computes the same sums. mma_q4k_ref states the result (fp32 weights, no rounding of
the weight: the codes are exact, only the fp32 sums round).

Split over K (narrow N) as in rows_q4k: fp32 partials [SPLIT, M, N] added in order by
gemv_q4k.split_sum_kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.quant.config import Q4kMmaConfig, split_for
from treeflash.kernels.quant.gemv_q4k import split_sum_kernel
from treeflash.kernels.quant.q4k_block import WORDS, half_low, scale_min
from treeflash.kernels.quant.reference import dequantize_ref

MMA_SCALES = ("group", "diag")


def mma_q4k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What mma_q4k computes, in plain torch: x [M, K] @ dequantize_ref(blocks)^T in fp32 -> [M, N]."""
    w = dequantize_ref(blocks, "Q4_K", k)  # [N, K] fp32
    return (x.float() @ w.t()).to(out_dtype or x.dtype)


# four code bytes -> the eight bf16 values 128 + q: low nibbles ($0, $1), high nibbles ($2, $3);
# prmt's selector 0x4140 puts byte 0 and byte 1 of the masked word under the constant byte 0x43
_CODES_ASM = tl.constexpr("""{
.reg .b32 l, h, c;
mov.b32 c, 0x43434343;
and.b32 l, $4, 0x0F0F0F0F;
shr.u32 h, $4, 4;
and.b32 h, h, 0x0F0F0F0F;
prmt.b32 $0, l, c, 0x4140;
prmt.b32 $1, l, c, 0x4342;
prmt.b32 $2, h, c, 0x4140;
prmt.b32 $3, h, c, 0x4342;
}""")


@triton.jit
def codes(q, ASM: tl.constexpr):
    """uint8 code bytes [R, C] -> (lo, hi): 128 + the low / high nibble of each, exact (bf16 with
    ASM; fp32 under the interpreter)."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(_CODES_ASM, "=r,=r,=r,=r,r", [q], dtype=(tl.bfloat16, tl.bfloat16),
                                           is_pure=True, pack=4)
    else:
        qi = q.to(tl.int32)
        lo = ((qi & 15) + 128).to(tl.float32)
        hi = ((qi >> 4) + 128).to(tl.float32)
    return lo, hi


@triton.jit
def _dot(a, b, ASM: tl.constexpr):
    if ASM:
        r = tl.dot(a, b.to(tl.bfloat16))
    else:
        r = tl.dot(a, b.to(tl.float32), input_precision="ieee")
    return r


@triton.jit(do_not_specialize=["M"])
def q4k_mma_kernel(X, W, B, Y, P, M, N, K, ROW_WORDS, BPS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr, SCALE: tl.constexpr, ASM: tl.constexpr,
                   SUMS_DOT: tl.constexpr):
    """Y [M, N] = X [M, K] @ dequant(W)^T for BLOCK_N weight rows x BLOCK_M rows of x over BPS
    super-blocks (PARTIAL: the fp32 partial P [SPLIT, M, N] instead). W: the Q4_K blocks as int32
    words [N, ROW_WORDS], B the same memory as bytes. SCALE "diag" needs M == 1 (BLOCK_M 16)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    part = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K
    ll = tl.arange(0, 32)
    jj = tl.arange(0, 16)  # "diag": the 16 columns of C
    if ASM:
        ones = tl.full([BLOCK_N, 32], 1.0, dtype=tl.bfloat16)
    else:
        ones = tl.full([BLOCK_N, 32], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_t = tl.zeros([BLOCK_N, 16], dtype=tl.float32)  # "diag": sum over blocks of T (C + V), summed over columns at the end
    for b in range(BPS):
        blk = part * BPS + b
        base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] word offsets of the block
        w0 = tl.load(W + base)
        w1 = tl.load(W + base + 1)
        w2 = tl.load(W + base + 2)
        w3 = tl.load(W + base + 3)
        d = half_low(w0)
        dmin = half_low(w0 >> 16)
        if SCALE == "diag":
            c_blk = tl.zeros([BLOCK_N, 16], dtype=tl.float32)  # columns g and 8 + g: C_g of this block
            s_blk = tl.zeros([BLOCK_N, 16], dtype=tl.float32)  # columns g and 8 + g: s_g
        for c in tl.static_range(4):
            q = tl.load(B + (4 * base + 16 + 32 * c)[:, None] + ll[None, :])  # [BLOCK_N, 32] code bytes
            lo, hi = codes(q, ASM)  # groups 2c (values 64c + l) and 2c + 1 (values 64c + 32 + l)
            for h in tl.static_range(2):
                g = 2 * c + h
                cg = lo if h == 0 else hi
                off = blk * 256 + 64 * c + 32 * h
                if SCALE == "diag":
                    # [32, 16]: group g's 32 values of x in columns g and 8 + g, zero elsewhere
                    xg = tl.load(X + off + ll[:, None] + 0 * jj[None, :], mask=((jj & 7) == g)[None, :], other=0.0)
                    c_blk += _dot(cg, xg, ASM)
                    if SUMS_DOT:  # s_g in columns g and 8 + g of every row, from the tensor cores (no shuffles)
                        s_blk += _dot(ones, xg, ASM)
                    else:
                        sg = tl.sum(tl.load(X + off + ll).to(tl.float32), axis=0)
                        s_blk += tl.where((jj & 7) == g, sg, 0.0)[None, :]
                else:
                    xg = tl.load(X + x_row[None, :] + (off + ll)[:, None], mask=m_ok[None, :], other=0.0)  # [32, BLOCK_M]
                    sg = tl.sum(xg.to(tl.float32), axis=0)  # [BLOCK_M]
                    sc, mn = scale_min(w1, w2, w3, g)
                    dsc = d * sc
                    acc += _dot(cg, xg, ASM) * dsc[:, None] - (128.0 * dsc + dmin * mn)[:, None] * sg[None, :]
        if SCALE == "diag":
            # T [BLOCK_N, 16]: column g < 8 d sc_g, column 8 + g -dmin m_g (ggml's get_scale_min_k4, four at a time)
            sc03 = w1 & 0x3F3F3F3F
            mn03 = w2 & 0x3F3F3F3F
            sc47 = (w3 & 0x0F0F0F0F) | ((w1 >> 2) & 0x30303030)
            mn47 = ((w3 >> 4) & 0x0F0F0F0F) | ((w2 >> 2) & 0x30303030)
            sel = jj[None, :] >> 2
            word = tl.where(sel == 0, sc03[:, None], tl.where(sel == 1, sc47[:, None],
                                                               tl.where(sel == 2, mn03[:, None], mn47[:, None])))
            t = ((word >> (8 * (jj[None, :] & 3))) & 255).to(tl.float32)
            t = t * tl.where(jj[None, :] < 8, d[:, None], -dmin[:, None])
            acc_t += t * tl.where(jj[None, :] < 8, c_blk - 128.0 * s_blk, s_blk)
    if SCALE == "diag":
        acc += tl.sum(acc_t, axis=1, keep_dims=True)  # only column 0 of acc is stored (M == 1)
    mask = (rows < N)[:, None] & m_ok[None, :]
    if PARTIAL:
        tl.store(P + (part * M + m[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=mask)
    else:
        tl.store(Y + m[None, :].to(tl.int64) * N + rows[:, None], acc.to(Y.dtype.element_ty), mask=mask)


def mma_q4k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Q4kMmaConfig, asm: bool) -> torch.Tensor:
    """out [M, N] = x [M, K] (contiguous) @ dequant(blocks)^T for Q4_K blocks uint8 [N, K / 256 * 144]
    (contiguous). asm: the PTX code path and bf16 dots (CUDA); False under the interpreter."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    scale = cfg.scale if m == 1 else "group"
    words = blocks.view(torch.int32)  # [N, nb * 36]
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, 16)
    split = split_for(nb, grid_n * grid_m, cfg.min_programs)
    part = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)  # [SPLIT, M, N] fp32
    q4k_mma_kernel[(grid_n, split, grid_m)](
        x, words, blocks, out, part, m, n, k, words.shape[1], nb // split, BLOCK_M=16, BLOCK_N=cfg.block_n,
        PARTIAL=split > 1, SCALE=scale, ASM=asm, SUMS_DOT=cfg.sums_dot, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out
