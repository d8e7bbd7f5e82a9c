"""quant_matmul: x @ dequant(blocks)^T with the weight kept in its GGUF blocks.

Routing by the number of rows M (the weight's bytes dominate at small M, so the kernels read each
stored block once and dequantize in registers): on CUDA, M == 1 takes the decode GEMV, 2 <= M <= 128
the small-M kernel; larger M dequantizes the weight to bf16 in row tiles and uses torch matmul
(compute-bound there, so tensor cores on a dense tile win). Without CUDA the reference path
(dequantize_ref + an fp32 matmul) runs.
"""

from __future__ import annotations

import torch

from treeflash.kernels.quant.formats import BlockFormatError, check_blocks, get_format
from treeflash.kernels.quant.reference import dequantize_ref

KERNEL_FORMATS: frozenset[str] = frozenset()


def has_kernel(fmt: str) -> bool:
    """True where quant_matmul has a Triton kernel for fmt; other formats are dequantized at load by
    the model side. An unknown name raises BlockFormatError."""
    return get_format(fmt).name in KERNEL_FORMATS


def quant_matmul_ref(x: torch.Tensor, blocks: torch.Tensor, fmt: str, k: int,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The plain-torch contract: x [M, K] @ dequantize_ref(blocks)^T in fp32 -> [M, N] out_dtype."""
    w = dequantize_ref(blocks, fmt, k)  # [N, K] fp32
    return (x.float() @ w.t()).to(out_dtype or x.dtype)


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str, k: int,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) @ dequant(blocks)^T -> [M, N] (out_dtype, default x's dtype).
    blocks: uint8 [N, K // block_values * block_bytes], rows as stored in GGUF, on x's device."""
    f = get_format(fmt)
    check_blocks(blocks, f, k)
    if x.dim() != 2 or x.shape[1] != k:
        raise BlockFormatError(f"quant_matmul: x must be [M, {k}], got {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise BlockFormatError(f"quant_matmul: x must be bf16, fp16 or fp32, got {x.dtype}")
    if blocks.device != x.device:
        raise BlockFormatError(f"quant_matmul: blocks on {blocks.device}, x on {x.device}")
    return quant_matmul_ref(x, blocks, f.name, k, out_dtype)
