"""GGUF weight block formats: what a stored row of blocks looks like, per ggml type.

A GGUF tensor of a block format stores each row [K] as K // block_values blocks of block_bytes
bytes (the scales and the packed values of block_values weights); rows are independent, so rows of
one format can be concatenated along N (fused q/k/v or gate/up). The numbers are ggml's
(`gguf.GGML_QUANT_SIZES`); tests/kernels/quant checks them against the installed `gguf`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class BlockFormatError(ValueError):
    """A block format name that this package does not know, or blocks whose shape does not match it."""


@dataclass(frozen=True)
class BlockFormat:
    name: str            # gguf type name: "Q4_K", "Q6_K", "Q8_0", ...
    ggml_type: int       # gguf.GGMLQuantizationType value
    block_values: int    # 32 or 256
    block_bytes: int     # bytes per block (gguf.GGML_QUANT_SIZES)

    def __post_init__(self):
        if self.block_values not in (32, 256) or self.block_bytes <= 0:
            raise BlockFormatError(f"{self.name}: block_values must be 32 or 256, block_bytes positive")

    def row_bytes(self, k: int) -> int:
        """Bytes of one stored row of k values (k a multiple of block_values)."""
        if k <= 0 or k % self.block_values:
            raise BlockFormatError(f"{self.name}: K = {k} is not a positive multiple of {self.block_values}")
        return k // self.block_values * self.block_bytes


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("Q4_0", 2, 32, 18),
    BlockFormat("Q4_1", 3, 32, 20),
    BlockFormat("Q5_0", 6, 32, 22),
    BlockFormat("Q5_1", 7, 32, 24),
    BlockFormat("Q8_0", 8, 32, 34),
    BlockFormat("Q2_K", 10, 256, 84),
    BlockFormat("Q3_K", 11, 256, 110),
    BlockFormat("Q4_K", 12, 256, 144),
    BlockFormat("Q5_K", 13, 256, 176),
    BlockFormat("Q6_K", 14, 256, 210),
    BlockFormat("IQ4_NL", 20, 32, 18),
    BlockFormat("IQ4_XS", 23, 256, 136),
)}


def get_format(fmt: str) -> BlockFormat:
    """The BlockFormat named fmt (a gguf type name), or a BlockFormatError naming it."""
    found = FORMATS.get(fmt)
    if found is None:
        raise BlockFormatError(f"unknown GGUF block format {fmt!r} (known: {', '.join(FORMATS)})")
    return found


def check_blocks(blocks: torch.Tensor, fmt: BlockFormat, k: int) -> int:
    """N, the number of rows of `blocks` (uint8 [N, row_bytes(k)], contiguous), or a BlockFormatError."""
    row = fmt.row_bytes(k)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != row:
        raise BlockFormatError(f"{fmt.name}: blocks must be uint8 [N, {row}] for K = {k}, got "
                               f"{blocks.dtype} {tuple(blocks.shape)}")
    if not blocks.is_contiguous():
        raise BlockFormatError(f"{fmt.name}: blocks must be contiguous")
    return blocks.shape[0]
