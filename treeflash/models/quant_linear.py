"""QuantLinear: a linear layer whose weight stays in its GGUF blocks, as the file stores them.

Decoding at batch 1 reads every weight once per token, so the bytes read set the speed: a 27B model
is 51 GB in bf16 and about 16 GB as Q4_K_M blocks. A QuantLinear holds the raw rows
`blocks [N, K / block_values * block_bytes] uint8` and the ggml format name, and its forward is
`quant_matmul` (treeflash.kernels.quant: the Triton kernels on CUDA,
dequantize + matmul elsewhere). Each row's blocks are independent, so layers of one format over one
input concatenate along N into one launch (`QuantLinear.concat`: fused q/k/v, gate/up, the DeltaNet's
input projections), the parts becoming row views of the fused blocks as `layers.fuse_linears` does.

A fix-up of llama.cpp's layout that permutes rows (llama q/k, qwen35 value heads) is applied to the
block rows at load; one that permutes columns (qwen35 `ssm_out`, whose inputs are the value heads)
cannot move inside a block, so the layer gathers its input instead (`in_index`): x W[:, p]^T =
x[:, p^-1] W^T.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from torch import nn

from treeflash.models.gguf_dequant import dequantize_rows
from treeflash.models.packed_linear import PackedLinear
from treeflash.kernels.quant import FORMATS, has_kernel, quant_matmul
from treeflash.kernels.quant.split_k import tile_counters
from treeflash.kernels.quant.config import DEFAULT_TUNING, QuantTuning


class QuantLinear(PackedLinear):
    """y = x W^T (+ b), W [N, K] kept as GGUF blocks of format `fmt` (see the module doc)."""

    def __init__(
        self,
        blocks: torch.Tensor,  # [N, K / block_values * block_bytes] uint8, rows as stored
        fmt: str,  # gguf type name ("Q4_K", "Q6_K", ...)
        in_features: int,  # K
        bias: torch.Tensor | None = None,  # [N]
        in_index: torch.Tensor | None = None,  # [K] long: the input's columns are gathered by it first
    ):
        super().__init__()
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        values, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or in_features % values or blocks.shape[1] != in_features // values * size:
            raise ValueError(f"QuantLinear {fmt}: blocks {tuple(blocks.shape)} {blocks.dtype} do not hold rows of {in_features} values")
        self.fmt, self.in_features, self.out_features = fmt, in_features, blocks.shape[0]
        self.register_buffer("blocks", blocks, persistent=False)
        self.register_buffer("in_index", in_index, persistent=False)
        # the M == 1 kernels' split over K: zeroed counters this layer keeps across calls (kernels.quant.split_k)
        self.register_buffer("split_counters", tile_counters(self.out_features, blocks.device), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.tuning = DEFAULT_TUNING  # which kernel and launch configuration quant_matmul takes (set_quant_tuning)

    @property
    def has_kernel(self) -> bool:
        return self.fmt in FORMATS and has_kernel(self.fmt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N] in x.dtype
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()  # the kernels read rows densely (no copy when already so)
        if self.in_index is not None:
            x2 = x2.index_select(1, self.in_index)
        if self.fmt in FORMATS:
            y = quant_matmul(x2, self.blocks, self.fmt, self.in_features, out_dtype=x.dtype, tuning=self.tuning,
                             counters=self.split_counters)
        else:  # a format kernels.quant does not decode (the i-quants below IQ4): gguf's dequantizer, then torch
            w = dequantize_rows(self.blocks, int(GGMLQuantizationType[self.fmt]), self.in_features, torch.float32)
            y = (x2.float() @ w.t()).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K]: the weight this layer multiplies by, in the model's column order."""
        from gguf import GGMLQuantizationType

        w = dequantize_rows(self.blocks, int(GGMLQuantizationType[self.fmt]), self.in_features, dtype)
        if self.in_index is not None:
            w = w.index_select(1, torch.argsort(self.in_index))
        return w

    def weight_bytes(self) -> int:
        """Bytes read per full pass over the weight (blocks, their scales included)."""
        return self.blocks.numel()

    @staticmethod
    def can_concat(layers: list[nn.Module]) -> bool:
        """Whether `layers` (same input) can share one launch: all QuantLinear of one format and input
        size, no input gather, biases on all or none."""
        if not layers or not all(isinstance(m, QuantLinear) for m in layers):
            return False
        first = layers[0]
        return not any(m.fmt != first.fmt or m.in_features != first.in_features or m.in_index is not None
                       or (m.bias is None) != (first.bias is None) for m in layers)

    @staticmethod
    def concat(layers: list[nn.Module]) -> "QuantLinear | None":
        """One QuantLinear over the outputs of `layers` (same input), or None unless can_concat. The
        layers' blocks (and biases) become row views of the fused ones."""
        if not QuantLinear.can_concat(layers):
            return None
        first = layers[0]
        sizes = [m.out_features for m in layers]
        blocks = torch.cat([m.blocks for m in layers])
        bias = None if first.bias is None else torch.cat([m.bias.data for m in layers])
        for i, (m, part) in enumerate(zip(layers, blocks.split(sizes))):
            m.blocks = part
            if bias is not None:
                m.bias = nn.Parameter(bias.split(sizes)[i], requires_grad=False)
        fused = QuantLinear(blocks, first.fmt, first.in_features, bias)
        fused.tuning = first.tuning
        return fused

    def extra_repr(self) -> str:
        gathered = ", input gathered" if self.in_index is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt} blocks{gathered}"


def set_quant_tuning(model: nn.Module, tuning: QuantTuning) -> int:
    """Give every QuantLinear of `model` the kernel routes and launch configurations of `tuning` (a frozen
    QuantTuning, passed down rather than set globally); before capturing CUDA graphs. Returns how many."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for m in layers:
        m.tuning = tuning
    return len(layers)
