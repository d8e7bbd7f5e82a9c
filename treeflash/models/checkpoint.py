"""What a checkpoint reader (hf_loader: safetensors; gguf_loader: GGUF) hands to `loader.load_model`:
the config and every tensor by our name, read lazily. Its own module so that the readers and the
loader import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from treeflash.models.config import ModelConfig


@dataclass(frozen=True)
class QuantBlocks:
    """A 2-D weight as stored GGUF blocks (for models.quant_linear.QuantLinear)."""

    blocks: torch.Tensor  # [N, K / block_values * block_bytes] uint8, rows in our order
    fmt: str  # gguf type name
    in_index: torch.Tensor | None  # [K] long: a column permutation the layer applies to its input


@dataclass
class TensorRef:
    """One checkpoint tensor, not yet read."""

    shape: tuple[int, ...]  # as our model expects it (after any layout fix-up)
    read: Callable[[torch.device, torch.dtype], torch.Tensor]  # -> tensor of `shape` on device, dtype
    origin: str  # the tensor's name in the file, for error messages
    ggml_type: int | None = None  # GGUF: the type the file stores it as
    read_blocks: Callable[[torch.device], QuantBlocks] | None = None  # GGUF 2-D block types: the raw rows


@dataclass
class Checkpoint:
    """What a format reader hands to `load_model`."""

    source: str  # the file or directory, for messages
    config: ModelConfig
    tensors: dict[str, TensorRef]  # our names (model.*, lm_head.*, mtp.*)
    load_tokenizer: Callable[[], Any]
    chat_template: str | None
    file_name: Callable[[str], str] = lambda name: name  # our name -> the name this format would use
    rope_freq_factors: TensorRef | None = None  # llama.cpp `rope_freqs`: inv_freq is divided by these
    skipped: list[str] = field(default_factory=list)  # tensors deliberately unused (vision tower, ...)
