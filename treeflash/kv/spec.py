"""CacheSpec: how one sequence's caches are allocated (length, dtype, device, KV formats), shared by
every cache module (kv/cache.py builds the layers from it; the layer caches read it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheSpec:
    max_len: int
    dtype: torch.dtype  # runtime dtype of activations
    device: torch.device
    cache_type_k: str = "auto"  # auto = the runtime dtype; or bf16, f16, f32, q8_0, q4_0, tq3_0
    cache_type_v: str = "auto"
    center_keys: bool = True  # compressed K: store keys minus the prompt's mean key (exact for attention)
    # the first this many attention layers store K at the runtime dtype whatever cache_type_k says
    # (Qwen2.5's layer-0 keys do not survive 3-4 bits: docs/kv.md, "Exact keys in the first layer")
    k_exact_layers: int = 0
    # q8_0 / q4_0 K: store keys after the Hadamard rotation tq3_0 uses (queries are rotated to match:
    # exact for attention); it spreads each 32-value block's largest value, which sets its scale
    rotate_keys: bool = True

    def __post_init__(self) -> None:
        if self.k_exact_layers < 0:
            raise ValueError(f"k_exact_layers must be >= 0, got {self.k_exact_layers}")
