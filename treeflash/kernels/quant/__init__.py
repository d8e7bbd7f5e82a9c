"""GGUF weights kept in their stored blocks: formats, plain-torch dequantizers and quantized matmul.

`dequantize_ref` (reference.py) is the contract, bit-identical to `gguf.quants.dequantize`;
`quant_matmul` (matmul.py) runs x @ dequant(blocks)^T through Triton kernels on CUDA (decode GEMV,
small-M tiles) and through the reference elsewhere; `has_kernel` says which formats have kernels
(the model side dequantizes the others at load).
"""

from treeflash.kernels.quant.formats import FORMATS, BlockFormat, BlockFormatError, get_format
from treeflash.kernels.quant.matmul import has_kernel, quant_matmul
from treeflash.kernels.quant.reference import dequantize_ref

__all__ = ["FORMATS", "BlockFormat", "BlockFormatError", "get_format", "dequantize_ref", "quant_matmul", "has_kernel"]
