"""The empirical parts of a memory plan: constants, each with the method that sets it.

Everything else in a plan is arithmetic over shapes (models/memory/parts.py). These are what that
arithmetic cannot see: the CUDA context, the allocator's rounding and fragmentation, and how many
bytes of temporaries one forward really holds at its peak relative to the tensors we count.
bench/fit_check.py measures them on the GPU (predicted vs torch.cuda.max_memory_reserved plus the
context, the card's used memory after the first CUDA op and GEMM). Until its JSON is in, the values
below say what each was measured on; docs/fit.md has the check's table.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class Overheads:
    """Measured on the H200 (torch 2.11, expandable segments: models/memory/allocator.py) by
    bench/fit_check.py, 2026-12-03 (bench/results/fit_check.json), except where a line says otherwise."""
    # CUDA context + cuBLAS handles: the card's used bytes (mem_get_info) after the first CUDA op and
    # GEMM; measured 718.8 MiB on the H200
    cuda_context_bytes: int = 719 * MiB
    # max_memory_reserved - max_memory_allocated: 47-1072 MiB (0.2-3.9%) over six configurations with expandable
    # segments; allocated after the build exceeded the counted parts by 127 MiB without a drafter
    allocator_slack_fraction: float = 0.01
    allocator_slack_bytes: int = 192 * MiB  # cuBLAS workspaces, Triton launch buffers: a fixed floor
    # the peak temporaries of one forward over T tokens, as a multiple of parts.activation_bytes(T)
    # (one layer's projections, the MLP's gate/up/act and T rows of logits)
    activation_factor: float = 1.0
    # the chunked Gated DeltaNet rule's temporaries over its projections' count (parts.layer_width):
    # the 27B shape's DeltaNet layer held 410 / 850 MiB at 1024 / 2048-token chunks against 84 / 168
    # MiB counted, the layer input included (a live-tensor count of the same torch code on the CPU)
    gdn_temporaries_factor: float = 4.8
    # copies of one prefill chunk's captured target features a DFlash prefill holds at once (the chunk's
    # output, its concatenation with the pending row, the normalised copy the drafter absorbs: spec/dflash.py)
    drafter_feature_copies: float = 3.0
    # a DFlash drafter on CUDA held 641-670 MiB after the build beyond its weights, KV and graph parts (drafters of
    # 2.0 GB at 32K context, 8B and hybrid-9B targets; the 27B's 3.5 GB drafter ~0.55 GB): about one cuBLAS
    # workspace (32 MiB on sm90) per captured graph's warm-up stream, ~20 of them, plus the device step's own graph.
    # models/runner.capture_graph now warms every capture up on one stream; plan.py counts the device step's
    # graph and this many bytes of workspace (predicted, not yet measured: bench/fit_check.py's next run)
    cublas_workspace_bytes: int = 64 * MiB  # cuBLAS's and cuBLASLt's on the one capture stream

    def __post_init__(self) -> None:
        for name in ("cuda_context_bytes", "allocator_slack_bytes", "cublas_workspace_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Overheads.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("allocator_slack_fraction", "activation_factor", "drafter_feature_copies", "gdn_temporaries_factor"):
            if not 0 <= getattr(self, name) < 100:
                raise ValueError(f"Overheads.{name} must be in [0, 100), got {getattr(self, name)}")
