"""The quantized-matmul backend QuantLinear calls: treeflash.kernels.quant (the Triton GEMV / small-M
kernels over stored GGUF blocks, owned by the kernels layer) where it is present.

Until that package is merged, a plain-torch stand-in with the same interface: gguf-py dequantizes
the blocks and torch multiplies, and `has_kernel` is False for every format, so the loader keeps
nothing quantized on CUDA (every tensor is dequantized at load, as before) while the CPU reference
path (tests, `--weights native` checks) still runs on the stored blocks. Delete the stand-in once
treeflash.kernels.quant is merged.
"""

from __future__ import annotations

import torch

try:
    from treeflash.kernels.quant import has_kernel, quant_matmul  # noqa: F401
except ImportError:  # treeflash.kernels.quant not merged yet: the stand-in below
    from gguf import GGMLQuantizationType as _T

    from treeflash.models.gguf_dequant import dequantize_rows as _dequantize_rows

    def has_kernel(fmt: str) -> bool:
        """No Triton kernel without treeflash.kernels.quant."""
        return False

    def quant_matmul(
        x: torch.Tensor,  # [M, K] bf16 / fp16 / fp32
        blocks: torch.Tensor,  # [N, K / block_values * block_bytes] uint8
        fmt: str,  # gguf type name
        k: int,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:  # [M, N] out_dtype (default x.dtype)
        """x @ dequant(blocks)^T: gguf-py's dequantizer, then torch (fp32 on the CPU, x's dtype elsewhere)."""
        w = _dequantize_rows(blocks, int(_T[fmt]), k, torch.float32)
        compute = torch.float32 if x.device.type == "cpu" else x.dtype
        y = torch.nn.functional.linear(x.to(compute), w.to(compute))
        return y.to(out_dtype or x.dtype)
