"""QuantEmbedding: a token embedding kept in its GGUF blocks; a lookup dequantizes only the rows it reads.

Dequantized to bf16 the 27B shape's embedding (248,320 x 5,120) is 2.54 GB; as the file's Q4_K blocks
it is 0.72 GB. A lookup gathers the rows' blocks ([T, row bytes] uint8: each row's blocks are
independent) and dequantizes those T rows: on CUDA through kernels.quant's dequantize kernel (one
launch, graph-capturable), elsewhere through its plain-torch reference. Both compute each value in
fp32 exactly as gguf's dequantizer does and round it once to the runtime dtype, as the loader does
when it dequantizes the whole table, so a row equals the dequantized table's row bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from treeflash.kernels.quant import dequantize_ref, get_format, has_kernel
from treeflash.kernels.quant.matmul import dequantize


class QuantEmbedding(nn.Module):
    """embedding(ids) = dequant(blocks[ids]) in `dtype`; blocks [V, D / block_values * block_bytes] uint8."""

    def __init__(self, blocks: torch.Tensor, fmt: str, embedding_dim: int, dtype: torch.dtype):
        super().__init__()
        f = get_format(fmt)  # an unknown format raises, naming the known ones
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or embedding_dim % f.block_values \
                or blocks.shape[1] != f.row_bytes(embedding_dim):
            raise ValueError(f"QuantEmbedding {fmt}: blocks {tuple(blocks.shape)} {blocks.dtype} do not hold rows of {embedding_dim} values")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"QuantEmbedding: dtype must be fp32, bf16 or fp16, got {dtype}")
        self.fmt, self.num_embeddings, self.embedding_dim, self.dtype = fmt, blocks.shape[0], embedding_dim, dtype
        self.register_buffer("blocks", blocks, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [...] long -> [..., D] dtype
        rows = self.blocks.index_select(0, input_ids.reshape(-1))  # [T, row bytes]
        if rows.is_cuda and has_kernel(self.fmt):
            out = torch.empty(rows.shape[0], self.embedding_dim, dtype=self.dtype, device=rows.device)
            dequantize(rows, self.fmt, self.embedding_dim, out)
        else:
            out = dequantize_ref(rows, self.fmt, self.embedding_dim).to(self.dtype)
        return out.view(*input_ids.shape, self.embedding_dim)

    def dequantized(self) -> torch.Tensor:
        """[V, D] in dtype: the whole table (tests, tools)."""
        return dequantize_ref(self.blocks, self.fmt, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.fmt} blocks, {str(self.dtype).replace('torch.', '')}"
