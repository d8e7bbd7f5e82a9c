"""The one builder of a target's runner beside its drafter, used by the engine, training's evaluation
and the tools: the same capture layers, buckets and binding everywhere, so no caller re-derives them.

With graphs, a CudaGraphRunner over the cache that captures the drafter's layers (CUDA graphs on a GPU;
use_graphs=False runs the same static-shape code eagerly, as the CPU tests do), and the drafter bound
to it (DFlash then drafts through static passes and builds its device loop); without, the eager runner.
"""

from __future__ import annotations

from treeflash.kv.cache import ModelCache
from treeflash.models.runner import DEFAULT_BUCKETS, CudaGraphRunner, EagerRunner
from treeflash.models.transformer import CausalLM
from treeflash.spec.drafter import Drafter


def build_runner(model: CausalLM, cache: ModelCache, drafter: Drafter | None = None, graphs: bool = True,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, use_graphs: bool | None = None,
                 bind: bool = True) -> EagerRunner:
    """The runner for `cache`; `bind`: hand it to the drafter (False: the drafter's layers are captured,
    its own passes stay eager)."""
    if not graphs:
        return EagerRunner(model, cache)
    capture = drafter.capture_layers if drafter is not None else ()
    runner = CudaGraphRunner(model, cache, capture_layers=capture, buckets=buckets, use_graphs=use_graphs)
    if drafter is not None and bind:
        drafter.bind_runner(runner)
    return runner
