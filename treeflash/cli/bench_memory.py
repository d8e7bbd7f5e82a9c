"""The bench JSON's "memory" section: the plan of the benchmarked configuration and the measured peak.

Planned: models/memory over the checkpoint's header at the bench's context (one engine; a bench that
builds several engines over one model, such as `--baseline ar`, holds one more cache per engine, so
"engines" is recorded beside it). Measured: torch.cuda.max_memory_reserved after the runs (CUDA only).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import replace

from treeflash.errors import TreeflashError


def planned(args: Namespace, max_context: int, device_type: str, engines: int, weights: str = "float") -> dict:
    from treeflash.cli.planning import Available, build_report, plan_inputs
    from treeflash.models.memory.plan import GRAPH_BUCKETS

    try:
        header, drafter, request = plan_inputs(args, device_type)
    except (TreeflashError, OSError) as e:  # a model given as an object (tests), an unreadable header
        return {"planned": None, "error": str(e), "engines": engines}
    # bench's engines capture every verify bucket (EngineConfig's default graph_buckets)
    request = replace(request, max_context=max_context, verify_nodes=GRAPH_BUCKETS[-1], weights=weights)
    report = build_report(header, request, drafter, Available(0, "not checked", False))
    plan = report.plan
    return {"planned": plan.as_dict()["parts"], "planned_total_bytes": plan.total, "kv_bytes_per_token": plan.kv_bytes_per_token,
            "max_context": max_context, "engines": engines}


def measured(section: dict, device_type: str) -> dict:
    """The section with the measured peak added (CUDA: bytes the caching allocator reserved at most)."""
    if device_type != "cuda":
        return {**section, "measured_max_reserved_bytes": None}
    import torch

    return {**section, "measured_max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "measured_max_allocated_bytes": int(torch.cuda.max_memory_allocated())}
