"""Small-M Q4_K matmul (2..128 rows of x: verify, drafting, prefill chunks), beside its plain-torch contract.

kernels.rows_kernel (any format) takes one tl.dot of K = 32 per group with the scale applied after,
its codes read byte by byte (decode.group), and it measured 3-4% of the quantized-bytes roofline
at M = 32 on the H200 (bench/results/quant_gemv.json). This kernel is the GPTQ/AWQ-in-Triton
structure on Q4_K's stored blocks (q4k_block.py): a program owns BLOCK_N weight rows and BLOCK_M
rows of x and walks its range of super-blocks; per block it loads the 4 header words once (d, dmin,
the 8 six-bit scales and mins) and, per chunk c of 32 code bytes, one [BLOCK_N, 32] byte tile
(16-byte copies), which both nibbles turn into weights w = d sc q - dmin m in fp32, rounded once to
x's dtype. The two [BLOCK_N, 32] halves (values 64c + l and 64c + 32 + l) are joined into one
[BLOCK_N, 64] tile in value order (column 32h + l), so x's [64, BLOCK_M] tile is one contiguous
load, and one tl.dot of K = 64 per chunk accumulates in fp32: four a block.

On sm_90 (tests/kernels/quant/test_compile.py) the join lowers to no data movement: the weight tile
is the wgmma's A operand in registers, and Triton's pipeliner copies the code bytes, the header
words and x asynchronously into shared memory a block ahead (x straight into the layout the
wgmma reads as its B operand), so nothing is staged through registers twice.

Operands swapped (acc [BLOCK_N, BLOCK_M] = w_tile @ x^T, stored transposed): the weight rows fill
the tensor core's M side (64 rows a warpgroup on sm_90) and the few rows of x its N side, which
may be as small as 16, so M = 2 pads x to 16 rows, not to 64 (the padding rows masked: zero-filled,
never read).

Precision: the weight is rounded to x's dtype (bf16/fp16) before the dot, as the large-M tiled path
and `--weights float` do; fp32 x keeps it fp32 (IEEE fp32 dot). DOT_F32 also serves bf16 x under
the Triton interpreter (its bf16 tl.dot is wrong): the rounded weight and x go in as fp32, whose
products of bf16 values are exact. rows_q4k_ref states the result.

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
from treeflash.kernels.quant.q4k_block import WORDS, half_low, nibble, scale_min
from treeflash.kernels.quant.reference import dequantize_ref


def rows_q4k_ref(x: torch.Tensor, blocks: torch.Tensor, k: int, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What rows_q4k computes, in plain torch: x [M, K] @ w^T in fp32 -> [M, N] out_dtype, where w is
    dequantize_ref(blocks) rounded to x's dtype (kept fp32 for fp32 x)."""
    w = dequantize_ref(blocks, "Q4_K", k)  # [N, K] fp32
    if x.dtype != torch.float32:
        w = w.to(x.dtype).float()
    return (x.float() @ w.t()).to(out_dtype or x.dtype)


@triton.jit(do_not_specialize=["M"])  # one compile for every M of a BLOCK_M
def q4k_rows_kernel(X, W, B, Y, P, M, N, K, ROW_WORDS, BPS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PARTIAL: tl.constexpr,
                    ROUND_W: tl.constexpr, DOT_F32: tl.constexpr):
    """Y [M, N] = X [M, K] @ dequant(W)^T for BLOCK_N weight rows x BLOCK_M rows of x over BPS blocks
    (PARTIAL: the fp32 partial P [SPLIT, M, N] of this program's split instead). W: the Q4_K blocks
    as int32 words [N, ROW_WORDS], B the same memory as bytes. Weight rows past N are clamped (loads
    unmasked, results dropped)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    part = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    row_w = tl.minimum(rows, N - 1).to(tl.int64) * ROW_WORDS
    m_ok = m < M
    x_row = tl.minimum(m, M - 1).to(tl.int64) * K
    ll = tl.arange(0, 32)
    kk = tl.arange(0, 64)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for b in range(BPS):
        blk = part * BPS + b
        base = tl.multiple_of(row_w + blk * WORDS, 4)  # [BLOCK_N] word offsets of the block
        w0 = tl.load(W + base)
        w1 = tl.load(W + base + 1)
        w2 = tl.load(W + base + 2)
        w3 = tl.load(W + base + 3)
        d = half_low(w0)
        dmin = half_low(w0 >> 16)
        for c in tl.static_range(4):
            q = tl.load(B + (4 * base + 16 + 32 * c)[:, None] + ll[None, :]).to(tl.int32)  # [BLOCK_N, 32] code bytes
            sc_lo, m_lo = scale_min(w1, w2, w3, 2 * c)
            sc_hi, m_hi = scale_min(w1, w2, w3, 2 * c + 1)
            w_lo = nibble(q, 0) * (d * sc_lo)[:, None] - (dmin * m_lo)[:, None]  # [BLOCK_N, 32]: values 64c + l
            w_hi = nibble(q, 4) * (d * sc_hi)[:, None] - (dmin * m_hi)[:, None]  # values 64c + 32 + l
            # [64, BLOCK_M]: values 64c + kk; rows of x past M masked (zero-filled, not read: M = 2 reads 2 rows, not 16)
            xt = tl.load(X + x_row[None, :] + (blk * 256 + 64 * c + kk)[:, None], mask=m_ok[None, :], other=0.0)
            if ROUND_W:
                w_lo = w_lo.to(X.dtype.element_ty)
                w_hi = w_hi.to(X.dtype.element_ty)
            wt = tl.join(w_lo, w_hi).permute(0, 2, 1).reshape(BLOCK_N, 64)  # [BLOCK_N, 64]: column 32h + l
            if DOT_F32:
                acc += tl.dot(wt.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(wt, xt)
    mask = (rows < N)[:, None] & m_ok[None, :]
    if PARTIAL:
        tl.store(P + (part * M + m[None, :]).to(tl.int64) * N + rows[:, None], acc, mask=mask)
    else:
        tl.store(Y + m[None, :].to(tl.int64) * N + rows[:, None], acc.to(Y.dtype.element_ty), mask=mask)


def block_m_for(m: int, cfg: Q4kRowsConfig) -> int:
    """BLOCK_M for M rows of x: the smallest power of two >= M, at least 16 (tl.dot), at most cfg.block_m."""
    return min(cfg.block_m, max(16, triton.next_power_of_2(m)))


def rows_q4k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, cfg: Q4kRowsConfig,
             dot_f32: bool) -> torch.Tensor:
    """out [M, N] = x [M, K] (contiguous) @ dequant(blocks)^T for Q4_K blocks uint8 [N, K / 256 * 144]
    (contiguous). dot_f32: take the IEEE fp32 dot (fp32 x; bf16 x under the interpreter)."""
    m, n, nb = x.shape[0], blocks.shape[0], k // 256
    words = blocks.view(torch.int32)  # [N, nb * 36]
    bm = block_m_for(m, cfg)
    grid_n, grid_m = triton.cdiv(n, cfg.block_n), triton.cdiv(m, bm)
    split = split_for(nb, grid_n * grid_m, cfg.min_programs)
    part = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)  # [SPLIT, M, N] fp32
    q4k_rows_kernel[(grid_n, split, grid_m)](
        x, words, blocks, out, part, m, n, k, words.shape[1], nb // split, BLOCK_M=bm, BLOCK_N=cfg.block_n,
        PARTIAL=split > 1, ROUND_W=x.dtype != torch.float32, DOT_F32=dot_f32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out
