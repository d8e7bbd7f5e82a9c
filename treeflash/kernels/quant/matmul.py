"""quant_matmul: x @ dequant(blocks)^T with the weight kept in its GGUF blocks.

Routing by the number of rows M (at small M the weight's bytes are the cost, so the kernels read
each stored block once and dequantize in registers): on CUDA (or under TRITON_INTERPRET=1, on CPU
tensors) M == 1 takes the decode GEMV (for Q4_K the kernel QuantTuning.q4k_gemv_route names), 2 <= M <= max_rows the small-M kernel (for Q4_K the one that
QuantTuning.q4k_rows_route names: rows_kernel, rows_q4k, mma_q4k, mmq_q4k or the dequantized tiles); larger M dequantizes
the weight in row tiles (to x's dtype) and uses torch matmul (compute-bound there: tensor cores on
a dense tile win). Elsewhere the reference path (dequantize_ref + an fp32 matmul) runs. The kernel
paths allocate only the output (and, for large M, the tile buffer) and never sync the host, so
they can be captured in CUDA graphs.
"""

from __future__ import annotations

import os

import torch
import triton

import treeflash.kernels.quant.dp4a_q3k as dp4a_q3k
import treeflash.kernels.quant.dp4a_q4k as dp4a_q4k
import treeflash.kernels.quant.dp4a_q6k as dp4a_q6k
import treeflash.kernels.quant.dp4a_q8_0 as dp4a_q8_0
import treeflash.kernels.quant.gemv_q4k as gemv_q4k
import treeflash.kernels.quant.kernels as kernels
import treeflash.kernels.quant.mma_q4k as mma_q4k
import treeflash.kernels.quant.mmq_q4k as mmq_q4k
import treeflash.kernels.quant.mmq_q6k as mmq_q6k
import treeflash.kernels.quant.rows_q4k as rows_q4k
import treeflash.kernels.quant.rows_q6k as rows_q6k
from treeflash.kernels.quant.config import DEFAULT_TUNING, QuantTuning, split_for
from treeflash.kernels.quant.decode import FMT_ID, GROUPS
from treeflash.kernels.quant.formats import BlockFormat, BlockFormatError, check_blocks, get_format
from treeflash.kernels.quant.reference import dequantize_ref

KERNEL_FORMATS: frozenset[str] = frozenset(GROUPS)
# kernels also run on CPU tensors under the Triton interpreter (read once: it is chosen when triton loads)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def has_kernel(fmt: str) -> bool:
    """True where quant_matmul has a Triton kernel for fmt; other formats are dequantized at load by
    the model side. An unknown name raises BlockFormatError."""
    return get_format(fmt).name in KERNEL_FORMATS


def quant_matmul_ref(x: torch.Tensor, blocks: torch.Tensor, fmt: str, k: int,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The plain-torch contract: x [M, K] @ dequantize_ref(blocks)^T in fp32 -> [M, N] out_dtype."""
    w = dequantize_ref(blocks, fmt, k)  # [N, K] fp32
    return (x.float() @ w.t()).to(out_dtype or x.dtype)


def _meta(f: BlockFormat, k: int) -> dict:
    s, g, min_mode = GROUPS[f.name]
    return dict(FMT=FMT_ID[f.name], QK=f.block_values, BB=f.block_bytes, S=s, G=g, MIN_MODE=min_mode)


def gemv(x: torch.Tensor, blocks: torch.Tensor, f: BlockFormat, k: int, out: torch.Tensor, tuning: QuantTuning) -> torch.Tensor:
    """out [1, N] = x [1, K] @ dequant(blocks)^T through kernels.gemv_kernel."""
    n = blocks.shape[0]
    cfg = tuning.gemv_config(f.name, n, k)
    nb = k // f.block_values
    unroll = cfg.unroll if nb % cfg.unroll == 0 else 1
    kernels.gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, blocks, blocks.view(torch.float16), out, n, f.row_bytes(k), nb, **_meta(f, k),
        BLOCK_N=cfg.block_n, UNROLL=unroll, num_warps=cfg.num_warps)
    return out


def gemv_words_q4k(x: torch.Tensor, blocks: torch.Tensor, k: int, out: torch.Tensor, tuning: QuantTuning) -> torch.Tensor:
    """out [1, N] = x [1, K] @ dequant(Q4_K blocks)^T through gemv_q4k (+ its split sum)."""
    n, nb, cfg = blocks.shape[0], k // 256, tuning.q4k
    words = blocks.view(torch.int32)  # [N, nb * 36]
    programs = triton.cdiv(n, cfg.block_n)
    split = split_for(nb, programs, cfg.min_programs)
    bps = nb // split
    unroll = cfg.unroll if bps % cfg.unroll == 0 else 1
    part = out if split == 1 else torch.empty(split, n, dtype=torch.float32, device=x.device)  # [SPLIT, N] fp32
    gemv_q4k.q4k_gemv_kernel[(programs, split)](x, words, blocks, out, part, n, words.shape[1], BPS=bps, SPLIT=split,
                                                BLOCK_N=cfg.block_n, UNROLL=unroll, X_TILE=cfg.x_tile, num_warps=cfg.num_warps)
    if split > 1:
        gemv_q4k.split_sum_kernel[(triton.cdiv(n, 1024),)](part, out, n, SPLIT=split, BLOCK=1024, num_warps=4)
    return out


def rows_matmul(x: torch.Tensor, blocks: torch.Tensor, f: BlockFormat, k: int, out: torch.Tensor, tuning: QuantTuning) -> torch.Tensor:
    """out [M, N] = x [M, K] @ dequant(blocks)^T through kernels.rows_kernel."""
    m, n = x.shape[0], blocks.shape[0]
    cfg = tuning.rows_config(f.name, n, k, m)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    kernels.rows_kernel[grid](
        x, blocks, blocks.view(torch.float16), out, m, n, k, f.row_bytes(k), k // f.block_values, **_meta(f, k),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_F32=_dot_f32(x), num_warps=cfg.num_warps)
    return out


def _dot_f32(x: torch.Tensor) -> bool:
    """The rows kernels take an IEEE fp32 tl.dot for fp32 x, and for bf16 x under the interpreter (whose bf16 dot is wrong)."""
    return x.dtype == torch.float32 or (_INTERPRET and x.dtype == torch.bfloat16)


def _mma_asm(x: torch.Tensor) -> bool:
    """mma_q4k's PTX code path and bf16 dots: bf16 x on CUDA (elsewhere exact fp32 codes and an IEEE fp32 dot)."""
    return x.is_cuda and not _INTERPRET and x.dtype == torch.bfloat16


def dequantize(blocks: torch.Tensor, fmt: str, k: int, out: torch.Tensor) -> torch.Tensor:
    """out [N, K] (fp32/bf16/fp16) = dequant(blocks) by kernels.dequant_kernel: with fp32 out, bit for
    bit dequantize_ref (no fused multiply-add, the reference's products in its order); narrower, that
    rounded once."""
    f = get_format(fmt)
    n = check_blocks(blocks, f, k)
    if out.shape != (n, k) or not out.is_contiguous() or out.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise BlockFormatError(f"dequantize: out must be contiguous fp32/bf16/fp16 [{n}, {k}], got {out.dtype} {tuple(out.shape)}")
    if n == 0:
        return out
    block_n = 16
    kernels.dequant_kernel[(triton.cdiv(n, block_n), k // f.block_values)](
        blocks, blocks.view(torch.float16), out, n, k, f.row_bytes(k), **_meta(f, k), BLOCK_N=block_n,
        num_warps=4, enable_fp_fusion=False)
    return out


def tiled_matmul(x: torch.Tensor, blocks: torch.Tensor, f: BlockFormat, k: int, out: torch.Tensor, tuning: QuantTuning) -> torch.Tensor:
    """out [M, N] = x @ dequant(blocks)^T for large M: dequantize dequant_rows weight rows at a time
    into one buffer (x's dtype) and multiply with torch (fp32 x: an fp32 matmul)."""
    n = blocks.shape[0]
    rows = min(n, tuning.dequant_rows)
    tile = torch.empty(rows, k, dtype=x.dtype, device=x.device)  # [rows, K]
    for n0 in range(0, n, rows):
        n1 = min(n, n0 + rows)
        w = dequantize(blocks[n0:n1], f.name, k, tile[: n1 - n0])
        out[:, n0:n1] = (x @ w.t()).to(out.dtype)
    return out


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str, k: int,
                 out_dtype: torch.dtype | None = None, tuning: QuantTuning = DEFAULT_TUNING,
                 counters: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) @ dequant(blocks)^T -> [M, N] (out_dtype, default x's dtype).
    blocks: uint8 [N, K // block_values * block_bytes], rows as stored in GGUF, on x's device. counters:
    zeroed int32 the caller keeps across calls for the M == 1 kernels' split over K (split_k.tile_counters)."""
    f = get_format(fmt)
    n = check_blocks(blocks, f, k)
    if x.dim() != 2 or x.shape[1] != k:
        raise BlockFormatError(f"quant_matmul: x must be [M, {k}], got {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise BlockFormatError(f"quant_matmul: x must be bf16, fp16 or fp32, got {x.dtype}")
    if blocks.device != x.device:
        raise BlockFormatError(f"quant_matmul: blocks on {blocks.device}, x on {x.device}")
    out_dtype = out_dtype or x.dtype
    if not (x.is_cuda or _INTERPRET) or f.name not in KERNEL_FORMATS:
        return quant_matmul_ref(x, blocks, f.name, k, out_dtype)
    m = x.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    x = x.contiguous()
    if m == 1:
        if f.name == "Q4_K" and blocks.is_contiguous() and tuning.q4k_gemv_route != "bytes":
            if tuning.q4k_gemv_route == "mma":
                return mma_q4k.mma_q4k(x, blocks, k, out, tuning.q4k_mma, _mma_asm(x))
            if tuning.q4k_gemv_route in ("dp4a", "lanes"):
                lanes = tuning.q4k_gemv_route == "lanes"
                return dp4a_q4k.dp4a_q4k(x, blocks, k, out, tuning.q4k_lanes if lanes else tuning.q4k_dp4a,
                                         x.is_cuda and not _INTERPRET, counters, lanes=lanes)
            if tuning.q4k_gemv_route == "q4k":
                return rows_q4k.rows_q4k(x, blocks, k, out, tuning.q4k_rows, _dot_f32(x))
            return gemv_words_q4k(x, blocks, k, out, tuning)
        if f.name == "Q6_K" and tuning.q6k_gemv_route in ("dp4a", "lanes") and blocks.is_contiguous() and (k // 256) % 2 == 0:
            lanes = tuning.q6k_gemv_route == "lanes"
            return dp4a_q6k.dp4a_q6k(x, blocks, k, out, tuning.q6k_lanes if lanes else tuning.q6k_dp4a,
                                     x.is_cuda and not _INTERPRET, lanes=lanes, counters=counters)
        if f.name == "Q6_K" and tuning.q6k_gemv_route in ("q6k", "dp4a", "lanes") and blocks.is_contiguous():
            return rows_q6k.rows_q6k(x, blocks, k, out, tuning.q4k_rows, _dot_f32(x))
        if f.name == "Q3_K" and tuning.q3k_gemv_route == "dp4a" and blocks.is_contiguous() and (k // 256) % 2 == 0:
            return dp4a_q3k.dp4a_q3k(x, blocks, k, out, tuning.q3k_dp4a, x.is_cuda and not _INTERPRET, counters)
        if f.name == "Q8_0" and tuning.q8_0_gemv_route == "dp4a" and blocks.is_contiguous() and (k // 32) % 2 == 0:
            return dp4a_q8_0.dp4a_q8_0(x, blocks, k, out, tuning.q8_0_dp4a, x.is_cuda and not _INTERPRET, counters)
        return gemv(x, blocks, f, k, out, tuning)
    if m <= tuning.max_rows:
        if f.name == "Q4_K" and tuning.q4k_rows_route == "q4k" and blocks.is_contiguous():
            return rows_q4k.rows_q4k(x, blocks, k, out, tuning.q4k_rows, _dot_f32(x))
        if f.name == "Q4_K" and tuning.q4k_rows_route == "mma" and blocks.is_contiguous():
            return mma_q4k.mma_q4k(x, blocks, k, out, tuning.q4k_mma, _mma_asm(x))
        if f.name == "Q4_K" and tuning.q4k_rows_route == "mmq" and blocks.is_contiguous():
            return mmq_q4k.mmq_q4k(x, blocks, k, out, tuning.q4k_mmq, x.is_cuda and not _INTERPRET)
        if f.name == "Q6_K" and tuning.q6k_rows_route == "q6k" and blocks.is_contiguous():
            return rows_q6k.rows_q6k(x, blocks, k, out, tuning.q4k_rows, _dot_f32(x))
        if f.name == "Q6_K" and tuning.q6k_rows_route == "mmq" and blocks.is_contiguous():
            return mmq_q6k.mmq_q6k(x, blocks, k, out, tuning.q6k_mmq, x.is_cuda and not _INTERPRET)
        if (f.name == "Q4_K" and tuning.q4k_rows_route == "tiled") or (f.name == "Q6_K" and tuning.q6k_rows_route == "tiled"):
            return tiled_matmul(x, blocks, f, k, out, tuning)
        return rows_matmul(x, blocks, f, k, out, tuning)
    return tiled_matmul(x, blocks, f, k, out, tuning)
