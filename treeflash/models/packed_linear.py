"""The base of linear layers whose weight is not one float tensor (models.int4_linear: 4-bit CPU
codes; models.quant_linear: GGUF blocks). Its own module so that layers.py, which fuses them, and the
layers themselves import it without importing each other."""

from __future__ import annotations

from torch import nn


class PackedLinear(nn.Module):
    """A linear layer whose weight is not one float tensor (4-bit CPU codes, GGUF blocks): it has
    in_features / out_features and a forward, no `.weight`. The fused and folded paths, which hand
    `.weight` to their own kernels, skip a model that holds one; `fuse()` concatenates such layers
    only through their own class (QuantLinear.concat)."""

    in_features: int
    out_features: int
