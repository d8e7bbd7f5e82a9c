"""Where a decode step's GPU time goes: the CUDA-graph replay of one decode step of a random-weight
model at a real shape, profiled kernel by kernel (torch.profiler / CUPTI sees the kernels inside
a graph replay). Prints the table and writes it as JSON.

    python -m bench.gpu_profile --shape qwen3-8b --out bench/results/gpu_profile_8b.json
    python -m bench.gpu_profile --shape smollm2-135m --drafter-layers 3  # a DFlash drafter's graphed pass
    python -m bench.gpu_profile --shape qwen3-8b --folded-decode          # norms folded into the projections
    python -m bench.gpu_profile --shape qwen3.5-27b:q4_k_m@mma/q4k --gguf-dir /tmp/gguf  # a random Q4_K_M GGUF, kernel routes
    python -m bench.gpu_profile --shape qwen3.5-27b --layers 8 --cache-type-k q8_0 --cache-type-v q8_0 \
        --fill 131072 --no-rotate-keys                                      # a compressed cache at 128K, unrotated keys
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


import torch
from torch.profiler import ProfilerActivity, profile

from bench.gpu_shapes import apply_tuning, build_model, load_shape, random_drafter
from treeflash.models.runner import CudaGraphRunner
from treeflash.models.step import StepInput


def drafter_pass_graph(model, runner, args):
    """A random DFlash drafter's graph for a pass with one new context row, after a prompt of
    `--context` rows (as gpu_speed.bench_drafter times it)."""
    drafter = random_drafter(model, args.drafter_layers, args.block_size)
    width = len(drafter.model.config.target_layer_ids) * model.config.hidden_size
    drafter.static_passes(runner.max_len)
    drafter.observe([0] * args.context, torch.randn(args.context, width, device=model.device, dtype=model.dtype))
    drafter.draft_logits(0)  # the prompt's pass (eager)
    drafter.observe([0], torch.randn(1, width, device=model.device, dtype=model.dtype))
    drafter._static_pass(0)  # the graphed pass's inputs are in place; replays repeat it
    return drafter.graphs.passes[1]


def step_sequence(prof, replays: int) -> list[dict]:
    """The last replay's kernels in launch order: name, start (us from the replay's first kernel), duration, and
    the gap since the previous kernel ended (negative: it started before that one ended, as PDL allows)."""
    kernels = sorted((e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")),
                     key=lambda e: e.time_range.start)
    if not kernels or len(kernels) % replays:
        return []
    last = kernels[-(len(kernels) // replays):]
    t0, out, prev_end = last[0].time_range.start, [], None
    for e in last:
        start, end = e.time_range.start, e.time_range.end
        out.append({"name": e.name[:90], "start_us": start - t0, "us": end - start,
                    "gap_us": 0.0 if prev_end is None else start - prev_end})
        prev_end = end if prev_end is None else max(prev_end, end)
    return out


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-8b", help="a bf16 shape, or SHAPE:MIX[@GEMV/ROWS[/Q6ROWS]] (a random GGUF kept in its blocks, as gpu_speed --quant)")
    p.add_argument("--gguf-dir", default="/tmp/treeflash-gguf", help="where SHAPE:MIX's random GGUF is written and reused")
    p.add_argument("--folded-decode", action=argparse.BooleanOptionalAction, default=None,
                   help="every norm folded into the projection after it, or none; default: the model's choice (as gpu_speed.py)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--layers", type=int, default=None, help="build only the shape's first layers (default: all)")
    p.add_argument("--cache-type-k", default="auto")
    p.add_argument("--cache-type-v", default="auto")
    p.add_argument("--rotate-keys", action=argparse.BooleanOptionalAction, default=True,
                   help="q8_0 / q4_0 keys stored rotated (CacheSpec.rotate_keys; default on, as the runtime)")
    p.add_argument("--fill", type=int, default=0,
                   help="> 0: no prefill; the cache's committed length set to this many rows (zeros), as "
                        "bench/kv_long_decode.py does, for long contexts (decode only)")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--bucket", type=int, default=1, help="profile the verify graph of this many nodes (1: decode)")
    p.add_argument("--drafter-layers", type=int, default=0,
                   help="profile a random DFlash drafter's graphed pass (this many layers, --block-size) instead")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--show-sequence", type=int, default=24, help="print the last replay's first this many kernels in order")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.fill and (args.drafter_layers or args.bucket != 1):
        p.error("--fill profiles the decode graph only (no --drafter-layers, --bucket 1)")
    if ":" in args.shape:
        if args.layers:
            p.error("--layers builds a bf16 shape; a SHAPE:MIX file has all its layers")
        model, extra, tuning = load_shape(args.shape, args.gguf_dir)
    else:
        model, extra, tuning = build_model(args.shape, layers=args.layers), {}, None
    model.fuse_projections(folded_decode=args.folded_decode)
    apply_tuning(model, tuning, extra)
    cache = model.new_cache(max(args.context, args.fill) + 256, args.cache_type_k, args.cache_type_v, rotate_keys=args.rotate_keys)
    buckets = tuple(sorted({1, args.bucket}))
    runner = CudaGraphRunner(model, cache, buckets=buckets)
    if args.fill:
        cache.seq_len = args.fill  # the rows stand in for a prefilled context (values do not change the speed)
    else:
        runner.forward(StepInput.plain(torch.randint(0, 1000, (args.context,), device="cuda"), 0), compute_logits=False)
    if args.drafter_layers:
        graph = drafter_pass_graph(model, runner, args)
    elif args.bucket == 1:
        runner.forward(StepInput.plain(torch.zeros(1, dtype=torch.long, device="cuda"), cache.seq_len))
        graph = runner.decode
    else:
        runner.forward(StepInput.chain(torch.zeros(args.bucket, dtype=torch.long), cache.seq_len))
        graph = runner.graphs[args.bucket]
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t <= 0:
            continue
        rows.append({"name": e.key[:90], "calls_per_step": e.count / args.replays, "us_per_step": t / args.replays})
    rows.sort(key=lambda r: -r["us_per_step"])
    sequence = step_sequence(prof, args.replays)
    total = sum(r["us_per_step"] for r in rows)
    calls = sum(r["calls_per_step"] for r in rows)
    print(f"{args.shape} folded_decode={model.folded_decode} bucket {args.bucket} cache "
          f"{args.cache_type_k}/{args.cache_type_v} rotate_keys={args.rotate_keys} context {cache.seq_len}: "
          f"{total:.0f} us of kernels per step, {calls:.0f} kernels")
    for r in rows[:30]:
        print(f"  {r['us_per_step']:8.1f} us  {r['calls_per_step']:6.0f}x  {r['name']}")
    if sequence:
        busy = sum(k["us"] for k in sequence)
        idle = sum(max(k["gap_us"], 0.0) for k in sequence[1:])
        span = sequence[-1]["start_us"] + sequence[-1]["us"]
        print(f"last replay in order: {len(sequence)} kernels over {span:.1f} us, {busy:.1f} us inside kernels, "
              f"{idle:.1f} us idle between them (gaps > 0), {sum(1 for k in sequence[1:] if k['gap_us'] < 0)} overlaps (PDL)")
        for k in sequence[:args.show_sequence]:
            print(f"  {k['start_us']:8.1f}  {k['us']:7.2f} us  gap {k['gap_us']:6.2f}  {k['name'][:70]}")
    if args.out:
        Path(args.out).write_text(json.dumps({"shape": args.shape, "folded_decode": model.folded_decode, "bucket": args.bucket,
                                              "layers": args.layers, "cache_type_k": args.cache_type_k, "cache_type_v": args.cache_type_v,
                                              "rotate_keys": args.rotate_keys, "context": cache.seq_len,
                                              "kernel_us_per_step": total, "kernels_per_step": calls, "rows": rows,
                                              "sequence": sequence, **extra}, indent=2))


if __name__ == "__main__":
    main()
