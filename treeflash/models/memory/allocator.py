"""The CUDA caching allocator's setting for serving: expandable segments.

With PyTorch's default allocator every large allocation that finds no cached block of its size class
maps a new segment, and freed blocks of different segments never merge. Prefill allocates buffers
that grow with the prefix (attention over the cache, chunk by chunk), so the allocator's reserve
ran far above what was ever allocated at once: on the H200 (bench/results/fit_check.json's first
run, default allocator) 8B bf16 at 64K context with a tq3_0 cache reserved 34.0 GiB for an
allocated peak of 18.8 GiB. With expandable segments a pool is one virtual range that grows and
shrinks by mapping pages, so freed space is reused for any size and the reserve follows the
allocated peak that the planner (plan.py) predicts. CUDA graphs' private pools support it (PyTorch
>= 2.5).

Called once by the entry points that build an engine on CUDA (cli/common.build_engine), before any
weight is read; a process-wide setting of PyTorch's, as torch.set_num_threads is.
"""

from __future__ import annotations

import torch


def use_expandable_segments() -> bool:
    """Turn on expandable segments for the CUDA caching allocator; False where there is no CUDA
    (nothing to configure) or this PyTorch has no such setting."""
    if not torch.cuda.is_available():
        return False
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if setter is None:
        return False
    setter("expandable_segments:True")
    return True
