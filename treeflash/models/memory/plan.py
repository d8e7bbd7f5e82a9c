"""plan_memory: a checkpoint header + a PlanRequest (+ a drafter) -> a MemoryPlan of named parts.

The plan is the sum of what the stack allocates and holds at its peak: weights as placed on the
device (placement.py), the KV cache of `max_context + 1` slots (Engine allocates one slot past the
context), recurrent state, rotary tables, the drafter's weights and caches, the CUDA graphs' static
outputs and their workspace, the prefill workspace at the chunk size, allocator slack and the CUDA
context. Every part is monotone in the context and the verify size, so the largest context and the
largest budget that fit are found by bisection over plan_memory itself (no second formula to drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from treeflash.kernels.kv import kv_formats as formats
import treeflash.models.memory.parts as parts
from treeflash.models.memory.header import CheckpointHeader
from treeflash.models.memory.overheads import Overheads
from treeflash.models.memory.placement import MTP_PREFIX, WEIGHT_MODES, device_bytes

DEVICE_TYPES = ("cuda", "cpu")
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # models/runner.py DEFAULT_BUCKETS: verify sizes captured as graphs
ROPE_MARGIN = 256  # models/transformer.py: Rotary tables reserve max_len + this many positions
PREFILL_CHUNK = 2048  # spec/decoder.py Decoder.prefill's chunk
DFLASH_MIN_ROWS = 256  # spec/dflash_model.py DraftCache.reserve grows to at least this many rows
DFLASH_TOP_K = 64  # spec/dflash_graph.py: top-K log-probs per depth (bounded by MAX_K)
DEVICE_STEP_AUTO_NODES = 33  # spec/device_step.py AUTO_BUDGET + 1: the device step's nodes under --budget auto


def graph_buckets(max_nodes: int) -> tuple[int, ...]:
    """The verify buckets a runner captures for steps of at most `max_nodes` nodes: every bucket up to
    the first that holds max_nodes (1 -> (1,); 6 -> (1, 2, 4, 8)); past the largest, all of them."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    last = next((b for b in GRAPH_BUCKETS if b >= max_nodes), GRAPH_BUCKETS[-1])
    return tuple(b for b in GRAPH_BUCKETS if b <= last)


@dataclass(frozen=True)
class DrafterShape:
    """What a drafter adds to the device, described by shapes (built by spec/drafter_memory.py)."""

    kind: str  # ngram | draft | mtp | dflash
    weights_bytes: int = 0  # its own weights on the device (dflash: its layers; draft: the draft model)
    num_layers: int = 0  # attention layers of its KV cache
    num_kv_heads: int = 0
    head_dim: int = 0
    rotary_dim: int = 0  # its rotary table's width (0: none of its own)
    state_bytes: int = 0  # recurrent state of a hybrid draft model
    capture_width: int = 0  # dflash: target features per token (len(target_layer_ids) * hidden)
    block_size: int = 0  # dflash: rows of one drafting pass
    hidden_size: int = 0
    intermediate_size: int = 0
    num_heads: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("ngram", "draft", "mtp", "dflash"):
            raise ValueError(f"unknown drafter kind {self.kind!r}")


@dataclass(frozen=True)
class PlanRequest:
    """One configuration to plan. Validated here; the CLI maps its flags onto it."""

    max_context: int  # tokens of context (the cache holds max_context + 1 slots)
    device_type: str = "cuda"
    dtype_bytes: int = 2  # the runtime dtype's element size (bf16 on CUDA, fp32 on a CPU)
    weights: str = "float"  # placement.WEIGHT_MODES
    cache_type_k: str = "auto"
    cache_type_v: str = "auto"
    k_exact_layers: int = 0
    center_keys: bool = True
    rotate_keys: bool = True
    verify_nodes: int = 1  # the most nodes one verify step holds (1: plain decoding)
    prefill_chunk: int = PREFILL_CHUNK
    cuda_graphs: bool = True
    include_cuda_context: bool = True  # False when the context already exists (measured free memory)
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self) -> None:
        if self.max_context < 1:
            raise ValueError(f"max_context must be >= 1, got {self.max_context}")
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"device_type must be one of {DEVICE_TYPES}, got {self.device_type!r}")
        if self.dtype_bytes not in (2, 4):
            raise ValueError(f"dtype_bytes must be 2 or 4, got {self.dtype_bytes}")
        if self.weights not in WEIGHT_MODES:
            raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {self.weights!r}")
        for t in (self.cache_type_k, self.cache_type_v):
            if t != formats.AUTO:
                formats.get_format(t)  # an unknown name raises ValueError listing the valid ones
        if self.verify_nodes < 1 or self.prefill_chunk < 1 or self.k_exact_layers < 0:
            raise ValueError("verify_nodes and prefill_chunk must be >= 1, k_exact_layers >= 0")

    @property
    def graphs(self) -> bool:
        return self.device_type == "cuda" and self.cuda_graphs

    @property
    def max_len(self) -> int:
        return self.max_context + 1


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    detail: str  # how it was computed, one line


@dataclass(frozen=True)
class MemoryPlan:
    source: str
    request: PlanRequest
    parts: tuple[Part, ...]
    kv_bytes_per_token: int  # K + V of the target's attention layers, one token
    drafter: str | None = None

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    def part(self, name: str) -> int:
        return sum(p.bytes for p in self.parts if p.name == name)

    def as_dict(self) -> dict[str, Any]:
        r = self.request
        return {
            "model": self.source,
            "drafter": self.drafter,
            "device": r.device_type,
            "max_context": r.max_context,
            "cache_type_k": r.cache_type_k,
            "cache_type_v": r.cache_type_v,
            "verify_nodes": r.verify_nodes,
            "weights": r.weights,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "parts": {p.name: p.bytes for p in self.parts},
            "details": {p.name: p.detail for p in self.parts},
            "total_bytes": self.total,
        }


def plan_memory(header: CheckpointHeader, request: PlanRequest, drafter: DrafterShape | None = None) -> MemoryPlan:
    c, r, o = header.config, request, request.overheads
    b = r.dtype_bytes
    out: list[Part] = []

    def add(name: str, nbytes: int, detail: str) -> None:
        out.append(Part(name, int(nbytes), detail))

    types: dict[str, int] = {}
    mtp = drafter is not None and drafter.kind == "mtp"
    for t in header.tensors:
        if t.name.startswith(MTP_PREFIX) and not mtp:  # the CLI reads the MTP head only for --draft mtp
            continue
        key = t.stored_type
        types[key] = types.get(key, 0) + device_bytes(t.name, t.shape, t.stored_type, t.stored_bytes, r.weights, r.device_type, b)
    weights = sum(types.values())
    add("weights", weights, "by stored type: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(types.items(), key=lambda kv: -kv[1])))
    if r.weights == "int4" and r.device_type == "cpu":
        head = next((t for t in header.tensors if t.name == "lm_head.weight"), None) or next(t for t in header.tensors if t.name == "model.embed_tokens.weight")
        add("head copy", head.numel * 2, "--weights int4: a bf16 copy of the head (models/int4_linear.py)")

    k, v = parts.attention_kv_bytes(c, r.max_len, r.cache_type_k, r.cache_type_v, b, r.k_exact_layers)
    per_token = (k + v) // r.max_len
    n_attn = len(c.attention_layer_ids)
    add("kv cache K", k, f"{r.cache_type_k}: {n_attn} layers x {c.num_kv_heads} heads x {c.head_dim} x {r.max_len} slots")
    add("kv cache V", v, f"{r.cache_type_v}: {n_attn} layers x {c.num_kv_heads} heads x {c.head_dim} x {r.max_len} slots")
    meta = parts.key_offset_bytes(c, r.cache_type_k, r.cache_type_v, r.k_exact_layers, r.center_keys)
    meta += parts.rotation_bytes(c, r.cache_type_k, r.cache_type_v, r.rotate_keys)
    if meta:
        add("kv metadata", meta, "fp32 key offsets per compressed-K layer, the Hadamard rotation")
    if c.is_hybrid:
        add("recurrent state", parts.recurrent_state_bytes(c, b), f"{len(c.linear_layer_ids)} DeltaNet layers: conv window + fp32 state")
    rope = parts.rope_table_bytes(c.rotary_dim, r.max_len + ROPE_MARGIN, b)
    if drafter is not None and drafter.rotary_dim:
        rope += parts.rope_table_bytes(drafter.rotary_dim, _drafter_rows(drafter, r) + ROPE_MARGIN, b)
    add("rope tables", rope, "cos and sin per position, target and drafter")

    capture = drafter.capture_width if drafter is not None and drafter.kind == "dflash" else 0
    if drafter is not None:
        _drafter_parts(add, header, r, drafter, o)

    if r.graphs:
        buckets = graph_buckets(r.verify_nodes)
        static = sum(parts.verify_graph_outputs(c, t, capture, b) for t in (1, *buckets))  # the decode graph + each verify graph
        add("verify graphs", static, f"decode + verify buckets {buckets}: logits, argmax, features, per-node DeltaNet rows")
        tmax = buckets[-1]
        work = parts.activation_bytes(c, tmax, tmax, b, o.gdn_temporaries_factor) * o.activation_factor + tmax * r.max_len  # + the step's key mask
        add("graph workspace", work, f"the largest graph's temporaries ({tmax} nodes) in the graphs' pool")
        if drafter is not None and drafter.kind == "dflash":
            d = drafter.block_size
            passes = (d - 1) * c.vocab_size * parts.FP32_BYTES + d * 2 * (d - 1) * DFLASH_TOP_K * 8
            add("drafter graphs", passes, f"{d} captured drafting passes: one logits [{d - 1}, vocab] fp32, top-K each")
    chunk = min(r.prefill_chunk, r.max_context)
    act = parts.activation_bytes(c, chunk, 1, b, o.gdn_temporaries_factor)
    kv_read = parts.prefill_kv_read_bytes(c, r.max_len, r.cache_type_k, r.cache_type_v, b)
    attending = chunk * parts.attention_layer_width(c) * b  # an attention layer's own tensors while it attends
    prefill = max(act * o.activation_factor, attending + kv_read)  # the widest layer, or an attention layer over the prefix
    detail = f"one {chunk}-token chunk's temporaries" + (", an attention layer's prefix rows (dequantized / repeated per query head)" if kv_read else "")
    if capture:  # beside graphs the drafter takes each chunk's rows as it comes (DFlashDrafter.observe_prompt)
        rows = chunk if r.graphs else r.max_context
        prefill += o.drafter_feature_copies * rows * capture * b
        detail += f", {o.drafter_feature_copies:g} copies of {'a chunk' if r.graphs else 'the prompt'}'s drafter features"
    add("prefill workspace", prefill, detail)
    if r.device_type == "cuda":
        held = sum(p.bytes for p in out)
        add("allocator slack", held * o.allocator_slack_fraction + o.allocator_slack_bytes,
            f"{o.allocator_slack_fraction:.0%} of the above + {o.allocator_slack_bytes / 2**20:.0f} MiB")
        if r.include_cuda_context:
            add("cuda context", o.cuda_context_bytes, "CUDA context and library handles (Overheads: a constant)")
    return MemoryPlan(header.source, r, tuple(out), per_token, drafter.kind if drafter is not None else None)


def _drafter_rows(d: DrafterShape, r: PlanRequest) -> int:
    if d.kind == "dflash":
        return max(r.max_len + d.block_size, DFLASH_MIN_ROWS)  # DFlashDrafter.static_passes: max_len + block
    return r.max_len + r.verify_nodes  # draft / mtp caches: the target's length + one verify tree


def _drafter_parts(add, header: CheckpointHeader, r: PlanRequest, d: DrafterShape, o: Overheads) -> None:
    b = r.dtype_bytes
    if d.weights_bytes:
        add("drafter weights", d.weights_bytes, f"{d.kind} drafter {d.source}")
        if d.kind == "dflash" and r.graphs:
            c = header.config
            t = min(r.verify_nodes, DEVICE_STEP_AUTO_NODES)  # spec/device_step.py: budget + 1 (--budget auto: 32 + 1)
            step = (parts.verify_graph_outputs(c, t, d.capture_width, b) + parts.activation_bytes(c, t, t, b, o.gdn_temporaries_factor)
                    + (d.block_size - 1) * c.vocab_size * parts.FP32_BYTES)
            add("drafter runtime", step + o.cublas_workspace_bytes,
                f"the device step's graph ({t} nodes: a verify's outputs and temporaries, a drafting pass's logits) + cuBLAS workspaces (Overheads)")
    if d.num_layers:
        rows = _drafter_rows(d, r)
        kv = 2 * d.num_layers * rows * d.num_kv_heads * d.head_dim * b
        add("drafter kv cache", kv, f"{d.num_layers} layers x {d.num_kv_heads} heads x {d.head_dim} x {rows} rows, K and V at the runtime dtype")
    if d.state_bytes:
        add("drafter state", d.state_bytes, "the draft model's DeltaNet state")


def fits(plan: MemoryPlan, available: int) -> bool:
    return plan.total <= available


def max_context(header: CheckpointHeader, request: PlanRequest, available: int, drafter: DrafterShape | None = None,
                limit: int | None = None) -> int:
    """The largest max_context (<= limit, default the model's max_position_embeddings) whose plan fits
    `available` bytes; 0 when not even one token fits."""
    hi = limit if limit is not None else header.config.max_position_embeddings

    def ok(n: int) -> bool:
        return plan_memory(header, replace(request, max_context=n), drafter).total <= available

    if not ok(1):
        return 0
    lo = 1
    if ok(hi):
        return hi
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def max_verify_nodes(header: CheckpointHeader, request: PlanRequest, available: int, drafter: DrafterShape | None = None) -> int:
    """The largest verify size among the graph buckets whose plan fits (0: none does). A tree budget is
    this minus the root."""
    best = 0
    for t in GRAPH_BUCKETS:
        if plan_memory(header, replace(request, verify_nodes=t), drafter).total <= available:
            best = t
    return best
