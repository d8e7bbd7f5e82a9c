"""The empirical parts of a memory plan: constants, each with the method that sets it.

Everything else in a plan is arithmetic over shapes (models/memory/parts.py). These are what that
arithmetic cannot see: the CUDA context, the allocator's rounding and fragmentation, and how many
bytes of temporaries one forward really holds at its peak relative to the tensors we count.
bench/fit_check.py measures them on the GPU (predicted vs torch.cuda.max_memory_reserved plus the
context, the card's used memory after the first CUDA op and GEMM). Until its JSON is in, the values
here are estimates (the context: ~500 MiB on an H200 with torch 2.11); docs/fit.md says which.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class Overheads:
    # CUDA context + cuBLAS handles: the card's used bytes (mem_get_info) after the first CUDA op and GEMM
    cuda_context_bytes: int = 500 * MiB
    # the caching allocator rounds blocks (2 MiB segments for large ones) and keeps freed blocks;
    # max_memory_reserved / (sum of live tensors at the peak) - 1 over fit_check's configurations
    allocator_slack_fraction: float = 0.03
    allocator_slack_bytes: int = 64 * MiB  # cuBLAS workspaces, Triton launch buffers: a fixed floor
    # the peak temporaries of one forward over T tokens, as a multiple of parts.activation_bytes(T)
    # (which counts one layer's projections, the MLP's gate/up/act and T rows of logits)
    activation_factor: float = 1.0
    # copies of the prompt's captured target features a DFlash prefill holds at once (the chunks'
    # outputs, their concatenation, the normalised copy the drafter absorbs: spec/dflash.py)
    drafter_feature_copies: float = 3.0

    def __post_init__(self) -> None:
        for name in ("cuda_context_bytes", "allocator_slack_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Overheads.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("allocator_slack_fraction", "activation_factor", "drafter_feature_copies"):
            if not 0 <= getattr(self, name) < 100:
                raise ValueError(f"Overheads.{name} must be in [0, 100), got {getattr(self, name)}")
