"""From CLI flags to a memory plan: the available bytes, the PlanRequest, the fit report and its table.

`treeflash fit` prints the report; serve and generate call `plan_at_start` before any weight is read:
it returns the context to allocate (`--max-context auto`: the most that fits) or refuses with the
planner's table (a TreeflashError: the CLI prints it and exits with status 2).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from treeflash.errors import InvalidRequestError, TreeflashError

GiB, MiB = 1 << 30, 1 << 20
CARDS = {  # --gpu-memory by name: the card's memory as sold
    "rtx3090": 24 * GiB, "rtx4090": 24 * GiB, "rtx5090": 32 * GiB, "l4": 24 * GiB, "a10": 24 * GiB, "l40s": 48 * GiB,
    "a100-40gb": 40 * GiB, "a100": 80 * GiB, "a100-80gb": 80 * GiB, "h100": 80 * GiB, "h200": 141 * GiB,
}
UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": MiB, "gib": GiB, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "k": 1 << 10, "m": MiB, "g": GiB}
CPU_AUTO_FRACTION = 0.5  # --max-context auto on a CPU: plan within half the available RAM (the rest is the system's)
DEFAULT_BUDGET_NODES = 128  # --budget auto: verify buckets up to the runner's largest
# prefill chunks the planner may take when the default (plan.PREFILL_CHUNK) does not fit: a smaller chunk
# holds fewer temporaries (the 27B shape's Gated DeltaNet chunk: 1.1 GB at 2048 tokens); multiples of the
# prefix cache's 256-token snapshot block
PREFILL_CHUNKS = (2048, 1024, 512, 256)


class PlanError(TreeflashError):
    """The configuration does not fit: the message carries the planner's table."""


def parse_memory(value: str) -> int | str:
    """--gpu-memory: 'auto', a size (24GiB, 24GB, 24000MiB, 24G) or a card name (rtx4090, h200) -> bytes or 'auto'."""
    v = value.strip().lower()
    if v == "auto":
        return "auto"
    if v in CARDS:
        return CARDS[v]
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", v)
    if not m or m.group(2) not in UNITS:
        raise InvalidRequestError(f"--gpu-memory: expected auto, a size such as 24GiB, 24GB or 24000MiB, or a card "
                                  f"({', '.join(sorted(CARDS))}); got {value!r}", "gpu_memory")
    n = int(float(m.group(1)) * UNITS[m.group(2)])
    if n <= 0:
        raise InvalidRequestError(f"--gpu-memory must be positive, got {value!r}", "gpu_memory")
    return n


def parse_budget(value) -> int | str:
    """--budget: 'auto' or an integer >= 0 (serve, generate, bench and the planner)."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise InvalidRequestError(f"--budget must be an integer or 'auto', got {value!r}", "budget") from None
    if n < 0:
        raise InvalidRequestError(f"--budget must be >= 0, got {n}", "budget")
    return n


def parse_context(value: str) -> int | str:
    """--max-context: a positive integer or 'auto'."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise InvalidRequestError(f"--max-context must be a positive integer or 'auto', got {value!r}", "max_context") from None
    if n < 1:
        raise InvalidRequestError(f"--max-context must be >= 1, got {n}", "max_context")
    return n


def verify_nodes(draft: str | None, budget: int | str, num_draft: int, tree: bool, block_size: int = 16) -> int:
    """The most nodes one verify step holds for these drafter flags (1: plain decoding)."""
    if not draft:
        return 1
    if draft == "dflash":
        if not tree:
            return block_size  # the chain: the root + block_size - 1 drafts
        return DEFAULT_BUDGET_NODES if budget == "auto" else int(budget) + 1
    return num_draft + 1


def available_ram() -> int:
    """Bytes the OS says a new allocation can take (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str  # where the figure came from, for the table
    includes_context: bool  # the CUDA context is already in use (measured free memory): not planned again


def available_memory(gpu_memory: int | str, device_type: str) -> Available:
    if device_type == "cpu":
        if gpu_memory != "auto":
            return Available(int(gpu_memory), "--gpu-memory (planning the CPU's RAM)", False)
        return Available(available_ram(), "available RAM (/proc/meminfo MemAvailable)", False)
    if gpu_memory != "auto":
        return Available(int(gpu_memory), "--gpu-memory", False)
    import torch

    if not torch.cuda.is_available():
        raise InvalidRequestError("--gpu-memory auto needs a CUDA device here; to plan another machine name its memory "
                                  "(--gpu-memory 24GiB, or a card: rtx4090, rtx5090, h200)", "gpu_memory")
    free, total = torch.cuda.mem_get_info()
    return Available(int(free), f"free on {torch.cuda.get_device_name()} (mem_get_info: {free / GiB:.1f} of {total / GiB:.1f} GiB)", True)


@dataclass(frozen=True)
class FitReport:
    plan: Any  # MemoryPlan at the requested (or chosen) context
    available: Available
    max_context: int  # the largest context that fits (0: none)
    max_verify_nodes: int  # the largest graph bucket that fits at plan's context (0: none)
    context_limit: int  # the model's max_position_embeddings
    note: str = ""  # how --max-context auto chose, or why it was capped

    @property
    def fits(self) -> bool:
        return self.plan.total <= self.available.bytes

    def suggestions(self, header, drafter) -> list[str]:
        """What to change when it does not fit (each checked against the plan)."""
        from treeflash.models.memory.plan import max_context, plan_memory

        if self.fits:
            return []
        r, out = self.plan.request, []
        if self.max_context:
            out.append(f"--max-context {self.max_context} (the largest that fits as configured)")
        for k, v in (("q8_0", "q8_0"), ("q8_0", "tq3_0"), ("q4_0", "q4_0"), ("tq3_0", "tq3_0")):
            if (k, v) == (r.cache_type_k, r.cache_type_v):
                continue
            smaller = replace(r, cache_type_k=k, cache_type_v=v)
            if plan_memory(header, smaller, drafter).total <= self.available.bytes:
                out.append(f"--cache-type-k {k} --cache-type-v {v} (fits at {r.max_context} tokens)")
                break
        if r.verify_nodes > 1 and self.max_verify_nodes:
            out.append(f"--budget {self.max_verify_nodes - 1} (verify graphs up to {self.max_verify_nodes} nodes)")
        if drafter is not None:
            bare = max_context(header, replace(r, verify_nodes=1), self.available.bytes, None, self.context_limit)
            if bare > self.max_context:
                out.append(f"no drafter: up to {bare} tokens")
        if not out:
            out.append("a larger GPU, or fewer weights on it (--weights native keeps GGUF blocks packed where supported)")
        return out


def build_report(header, request, drafter, available: Available, note: str = "", chunks: tuple[int, ...] = ()) -> FitReport:
    """chunks: the prefill chunks the planner may take (the largest context that fits is over them; default the request's)."""
    from treeflash.models.memory.plan import max_context, max_verify_nodes, plan_memory

    if available.includes_context:
        request = replace(request, include_cuda_context=False)
    limit = header.config.max_position_embeddings
    plan = plan_memory(header, request, drafter)
    best = max(max_context(header, replace(request, prefill_chunk=c), available.bytes, drafter, limit) for c in chunks or (request.prefill_chunk,))
    nodes = max_verify_nodes(header, request, available.bytes, drafter)
    return FitReport(plan, available, best, nodes, limit, note)


def render(report: FitReport, header, drafter) -> str:
    p, r = report.plan, report.plan.request
    name_w = max(len(x.name) for x in p.parts)
    lines = [f"memory plan: {p.source}" + (f" + {p.drafter} drafter" if p.drafter else ""),
             f"  {r.device_type}, context {r.max_context} tokens, K {r.cache_type_k} / V {r.cache_type_v}, "
             f"verify up to {r.verify_nodes} nodes, weights {r.weights}; KV {p.kv_bytes_per_token} bytes/token", ""]
    for x in p.parts:
        lines.append(f"  {x.name:<{name_w}}  {x.bytes / MiB:>10.1f} MiB  {x.detail}")
    lines.append(f"  {'total':<{name_w}}  {p.total / MiB:>10.1f} MiB")
    lines.append(f"  {'available':<{name_w}}  {report.available.bytes / MiB:>10.1f} MiB  {report.available.source}")
    lines.append("")
    verdict = "yes" if report.fits else "NO"
    spare = report.available.bytes - p.total
    lines.append(f"fits: {verdict} ({abs(spare) / MiB:.0f} MiB {'to spare' if spare >= 0 else 'over'})")
    limit = f" (the model's limit is {report.context_limit})" if report.max_context >= report.context_limit else ""
    lines.append(f"largest context that fits: {report.max_context} tokens{limit}")
    if r.verify_nodes > 1:
        lines.append(f"largest verify step that fits at {r.max_context} tokens: {report.max_verify_nodes} nodes "
                     f"(budget {max(report.max_verify_nodes - 1, 0)})")
    if report.note:
        lines.append(report.note)
    for s in report.suggestions(header, drafter):
        lines.append(f"  try: {s}")
    return "\n".join(lines)


def report_dict(report: FitReport, header, drafter) -> dict:
    return {**report.plan.as_dict(), "available_bytes": report.available.bytes, "available_source": report.available.source,
            "fits": report.fits, "max_context_that_fits": report.max_context, "max_verify_nodes_that_fit": report.max_verify_nodes,
            "model_context_limit": report.context_limit, "note": report.note, "suggestions": report.suggestions(header, drafter)}


AUTO_WEIGHTS_CONTEXT = 8192  # --weights auto: float when the dequantized weights fit at this context (or the one asked for)


def plan_inputs(args, device_type: str):
    """(header, drafter shape, PlanRequest at max_context 1) for the parsed flags (--weights auto: float)."""
    from treeflash.models.memory import PlanRequest, read_header
    from treeflash.spec.drafter_memory import drafter_shape

    path = args.model
    if path is None:
        from treeflash.models.default_model import default_model_path

        path = str(default_model_path())
    header = read_header(path)
    dtype = getattr(args, "dtype", None)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype] if dtype else (4 if device_type == "cpu" else 2)
    drafter = drafter_shape(args.draft, args.draft_model, header, dtype_bytes, device_type, getattr(args, "drafter_weights", "float"))
    budget = getattr(args, "budget", "auto")
    budget = parse_budget(budget)
    nodes = verify_nodes(args.draft, budget, args.num_draft, not args.no_tree, drafter.block_size if drafter and drafter.block_size else 16)
    try:
        weights = getattr(args, "weights", "float")
        chunk = getattr(args, "prefill_chunk", "auto")
        request = PlanRequest(1, device_type=device_type, dtype_bytes=dtype_bytes, weights="float" if weights == "auto" else weights,
                              prefill_chunk=PREFILL_CHUNKS[0] if chunk == "auto" else int(chunk),
                              cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
                              k_exact_layers=getattr(args, "cache_k_exact_layers", 0), verify_nodes=nodes)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None
    return header, drafter, request


def fit_report(args, device_type: str) -> tuple[FitReport, Any, Any]:
    """The report for `treeflash fit` (and the start of serve/generate): (report, header, drafter)."""
    header, drafter, request = plan_inputs(args, device_type)
    gpu_memory = parse_memory(args.gpu_memory) if isinstance(args.gpu_memory, str) else args.gpu_memory
    available = available_memory(gpu_memory, device_type)
    context = parse_context(str(args.max_context))
    if getattr(args, "weights", "float") == "auto":
        request = replace(request, weights=auto_weights(header, request, drafter, available, context))
    return _fit_report(header, drafter, request, available, context, gpu_memory, device_type, getattr(args, "prefill_chunk", "auto"))


def auto_weights(header, request, drafter, available, context) -> str:
    """--weights auto: "float" (the dequantized weights: today's faster kernels), unless the checkpoint
    is a GGUF on CUDA whose dequantized plan does not fit at the context asked for (auto: at
    AUTO_WEIGHTS_CONTEXT tokens) while its blocks kept as stored ("native") do."""
    if header.format != "gguf" or request.device_type != "cuda":
        return "float"
    n = min(AUTO_WEIGHTS_CONTEXT if context == "auto" else context, header.config.max_position_embeddings)
    req = replace(request, max_context=n, include_cuda_context=not available.includes_context)
    from treeflash.models.memory import plan_memory

    if plan_memory(header, req, drafter).total <= available.bytes:
        return "float"
    native = plan_memory(header, replace(req, weights="native"), drafter).total <= available.bytes
    return "native" if native else "float"


def parse_prefill_chunk(value: str) -> int | str:
    """--prefill-chunk: 'auto' (the largest of PREFILL_CHUNKS that fits) or a positive integer."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected auto or a positive integer, got {value!r}")
    return n


def _fit_report(header, drafter, request, available, context, gpu_memory, device_type: str,
                prefill_chunk: int | str = "auto") -> tuple[FitReport, Any, Any]:
    limit = header.config.max_position_embeddings
    note = ""
    # beside a drafter (its caches and graphs on top of the target's) the plan may take a smaller prefill chunk
    # (PREFILL_CHUNKS): the largest that fits an explicit context; under --max-context auto the one with the largest context
    chunks = PREFILL_CHUNKS if prefill_chunk == "auto" and drafter is not None else (request.prefill_chunk,)
    if context == "auto":
        budget = available
        if device_type == "cpu" and gpu_memory == "auto":
            budget = replace(available, bytes=int(available.bytes * CPU_AUTO_FRACTION))
            note = f"--max-context auto on the CPU: within {CPU_AUTO_FRACTION:.0%} of the available RAM, at most the model's {limit}"
        from treeflash.models.memory.plan import max_context

        req = replace(request, include_cuda_context=not budget.includes_context)
        context, chunk = max((max_context(header, replace(req, prefill_chunk=c), budget.bytes, drafter, limit), c) for c in chunks)
        chunk_note = f"; prefill in {chunk}-token chunks: more context than the default {request.prefill_chunk}'s" if chunk != request.prefill_chunk else ""
        request = replace(request, prefill_chunk=chunk)
        if context == 0:
            context = 1  # nothing fits: plan one token so the table shows by how much
        else:
            note = (note or f"--max-context auto: the largest context that fits, {context} tokens") + chunk_note
    elif context > limit:
        note = f"--max-context {context} is past the model's {limit}: the engine allocates {limit}"
        context = limit
    request = replace(request, max_context=context)
    report = build_report(header, request, drafter, available, note, chunks)
    for chunk in chunks:
        if report.fits or chunk >= request.prefill_chunk:
            continue
        smaller = build_report(header, replace(request, prefill_chunk=chunk), drafter, available,
                               (note + "; " if note else "") + f"prefill in {chunk}-token chunks: the default {request.prefill_chunk} does not fit", chunks)
        if smaller.fits:
            report = smaller
            break
    return report, header, drafter


@dataclass(frozen=True)
class StartPlan:
    max_context: int
    verify_nodes: int
    plan: Any  # MemoryPlan
    summary: str  # one line for stderr: the context chosen and the plan against the memory
    weights: str = "float"  # the weight format to load (--weights auto resolved)
    prefill_chunk: int = 2048  # tokens per prefill chunk the plan was made for (PREFILL_CHUNKS)


def resolved_weights(args) -> str:
    """--weights as load_model takes it: auto resolved against the plan (auto_weights)."""
    weights = getattr(args, "weights", "float")
    if weights != "auto":
        return weights
    from treeflash.models.loader import resolve_device

    try:
        report, _, _ = fit_report(args, resolve_device(args.device).type)
    except (TreeflashError, OSError):  # an unreadable header: the loader says why, with float
        return "float"
    return report.plan.request.weights


def plan_at_start(args) -> StartPlan:
    """serve / generate: the context to allocate; PlanError (with the table) when it does not fit."""
    from treeflash.models.loader import resolve_device

    device_type = resolve_device(args.device).type
    report, header, drafter = fit_report(args, device_type)
    if not report.fits:
        raise PlanError("the configuration does not fit in memory; nothing was loaded\n" + render(report, header, drafter))
    r = report.plan.request
    summary = (f"context {r.max_context} tokens: planned {report.plan.total / MiB:.0f} MiB of {report.available.bytes / MiB:.0f} MiB "
               f"({report.available.source})" + (f"; {report.note}" if report.note else ""))
    if getattr(args, "weights", "float") == "auto":
        summary += f"; weights {r.weights} (--weights auto)"
    return StartPlan(r.max_context, r.verify_nodes, report.plan, summary, r.weights, r.prefill_chunk)
