"""Per-device scratch buffers for kernels that merge work across programs: partial sums and atomic
tickets (the last program to take a ticket does the merge and puts the ticket back to zero).

A buffer grows on demand, but never during CUDA-graph capture (a graph would keep a pointer to
memory that a later growth frees): the runners' warm-up calls, made before capture, reserve them.
Calls on one stream never overlap, so every kernel of one kind shares its buffer.
"""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple[str, torch.device], torch.Tensor] = {}


def scratch(name: str, device: torch.device, numel: int, dtype: torch.dtype, minimum: int = 4096) -> torch.Tensor:
    """The `name` buffer on `device`, at least `numel` elements (zeros when first made: tickets
    start at zero and every kernel leaves them there)."""
    key = (name, torch.device(device))
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < numel or buf.dtype != dtype:
        if key[1].type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"scratch {name!r}: must be reserved before CUDA-graph capture (run the step once first)")
        buf = _BUFFERS[key] = torch.zeros(max(numel, minimum), dtype=dtype, device=device)
    return buf
