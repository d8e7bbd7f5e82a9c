"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's kernels.

Inside a CUDA graph, each kernel of a decode step still waits for the one before it to drain and
then pays its own launch and ramp-up: ~1-2 us per kernel boundary, ~10 boundaries per layer. A
kernel launched with PDL may start while its predecessor is still running: its programs are placed
as soon as every program of the predecessor has called `griddepcontrol.launch_dependents` (or
exited), and they block in `griddepcontrol.wait` until the predecessor has completed and its
writes are visible. What a kernel does before its wait must not depend on the predecessor: reading
weights (gemv prefetches its first weight tile there) is fine; reading activations or writing
anything is not. Every PDL kernel waits before it ends, so the ordering stays transitive (a kernel
two launches back has completed once the one before has).

Kernels opt in with a `PDL: tl.constexpr` argument, call `enter(PDL)` (trigger, then wait) at
their start or `trigger` / `wait` around their prefetch, and are launched with `**kwargs(x)`.
Off on the CPU, under the Triton interpreter (it cannot run the inline PTX), before sm_90, with a
triton older than 3.3 (no griddepcontrol helpers). A kernel without PDL
(cuBLAS, torch's) after or before one of ours simply serializes as usual.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
try:  # triton >= 3.3
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAVE_GDC = True
except ImportError:  # an older triton: PDL stays off (the names below are never traced then)
    _HAVE_GDC = False
    gdc_launch_dependents = gdc_wait = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's own setting: the interpreter cannot run PTX


@cache
def _supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def flag(x: torch.Tensor) -> bool:
    """Whether kernels on x's device launch with PDL (the value of their PDL constexpr)."""
    return _HAVE_GDC and x.is_cuda and not _INTERPRET and _supported(x.device.index or 0)


def kwargs(x: torch.Tensor) -> dict:
    """The launch keywords of a PDL kernel on x's device: its PDL constexpr, and launch_pdl where on."""
    return {"PDL": True, "launch_pdl": True} if flag(x) else {"PDL": False}


@triton.jit
def trigger(PDL: tl.constexpr):
    """Let the next kernel's programs be placed (they still wait for this kernel to complete)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def wait(PDL: tl.constexpr):
    """Block until the previous kernel has completed and its writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def enter(PDL: tl.constexpr):
    """trigger, then wait: for kernels that read their inputs first thing."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
