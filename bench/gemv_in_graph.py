"""The decode GEMVs' launch configurations chosen inside the whole step, not in isolation.

bench/gpu_gemv.py times each projection alone (every weight byte from memory); inside the graphed
decode step the same kernel follows a norm or the attention, with PDL overlap and a cold start,
and the fastest isolated configuration need not be the fastest there (the 8B q/k/v GEMV
took 15.1-15.4 us in the step against 13.8 us alone). This builds one random-weight model, and for
each candidate configuration of one projection shape (the others as gemv.TUNED has them) captures
the decode graph again and times the step: the pipelined rate as `generate` runs it (Decoder) and
the graph replay alone. The shipped configuration is timed between candidates (drift check).

    python -m bench.gemv_in_graph --shape qwen3-8b --out bench/results/gemv_in_graph_8b.json
    python -m bench.gemv_in_graph --shape qwen3-8b --only 6144x4096 --tokens 128
    python -m bench.gemv_in_graph --base 4096x12288=2,2048,1,4 --candidates 4096x4096=8,1024,1,4   # on top of a change

Candidates are `BN,BK,SPLIT,WARPS` per shape (--candidates 6144x4096=8,512,1,4 6144x4096=4,1024,1,4 ...);
"swiglu:NxK" names a gate_up weight of gemv.TUNED.swiglu (SPLIT must be 1). The defaults below cover the 8B
shape's q/k/v, o_proj and down.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


import torch

from bench.gpu_shapes import build_model, cuda_time, measure_bandwidth, step_bytes, sync
from treeflash.kernels.linear import gemv
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams

DEFAULT_CANDIDATES = {
    "6144x4096": ["8,512,1,4", "4,1024,1,4", "16,1024,1,8", "4,2048,1,4", "8,2048,1,8", "8,1024,2,4", "2,2048,1,4"],
    "4096x4096": ["4,1024,1,4", "8,1024,1,4", "2,1024,1,4", "4,2048,1,8", "8,512,1,4"],
    "4096x12288": ["2,2048,1,4", "8,1024,1,4", "4,2048,1,8", "4,1024,2,4", "2,1024,1,4"],
}


def table_key(shape: str) -> tuple[str, int, int]:
    """"NxK" (gemv.TUNED.linear) or "swiglu:NxK" (gemv.TUNED.swiglu, N = 2I rows of gate_up) -> (table, N, K)."""
    kind, _, dims = shape.rpartition(":")
    try:
        n, k = (int(v) for v in dims.split("x"))
    except ValueError:
        raise SystemExit(f"{shape!r} is not NxK or swiglu:NxK") from None
    if kind not in ("", "swiglu"):
        raise SystemExit(f"{shape!r}: the only table prefix is 'swiglu:'")
    return ("swiglu" if kind else "gemv", n, k)


def parse_config(text: str) -> gemv.GemvConfig:
    try:
        bn, bk, sk, w = (int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"--candidates: {text!r} is not BN,BK,SPLIT,WARPS") from None
    return gemv.GemvConfig(bn, bk, sk, w)


def time_step(model, prompt: list[int], tokens: int, rounds: int) -> dict:
    """Capture the decode graph under the model's current GEMV tables and time it: pipelined tokens/s (median of
    `rounds` runs of `tokens` Decoder steps) and the graph replay alone (CUDA events)."""
    cache = model.new_cache(len(prompt) + rounds * (tokens + 8) + 64)
    runner = CudaGraphRunner(model, cache, buckets=(1,))
    rates = []
    for _ in range(rounds):
        cache.reset()
        dec = Decoder(model, cache, SamplingParams(), runner=runner)
        dec.prefill(prompt)
        for _ in range(3):
            dec.step()
        sync()
        t0 = time.perf_counter()
        for _ in range(tokens):
            dec.step()
        sync()
        rates.append(tokens / (time.perf_counter() - t0))
    graph_ms = cuda_time(runner.decode.replay, iters=30) * 1e3
    nbytes = step_bytes(model, cache, cache.seq_len)
    runner = cache = dec = None  # free the graphs' memory before the next capture
    torch.cuda.empty_cache()
    return {"pipelined_tokens_per_s": statistics.median(rates), "rounds": rates, "graph_ms": graph_ms, "bytes": nbytes}


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-8b")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--tokens", type=int, default=64, help="decode steps per timed round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration (the median is kept)")
    p.add_argument("--only", nargs="*", default=None, help="shapes NxK to vary (default: every shape with candidates)")
    p.add_argument("--candidates", nargs="*", default=None,
                   help="NxK=BN,BK,SPLIT,WARPS entries replacing the default candidates (repeat a shape for several)")
    p.add_argument("--base", nargs="*", default=[],
                   help="NxK=BN,BK,SPLIT,WARPS entries applied on top of gemv.TUNED for every run but the shipped ones "
                        "(candidates then vary one shape of that set; the shipped set and the base are both timed)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemv_in_graph.py times CUDA graphs: it needs a GPU")
    cands = DEFAULT_CANDIDATES
    if args.candidates:
        cands = {}
        for entry in args.candidates:
            shape, _, cfg = entry.partition("=")
            cands.setdefault(shape, []).append(cfg)
    shapes = args.only or list(cands)
    bandwidth = measure_bandwidth()
    model = build_model(args.shape)
    model.fuse_projections()
    prompt = torch.randint(0, model.config.vocab_size, (args.context,)).tolist()
    shipped = {("gemv", n, k): c for (n, k), c in gemv.TUNED.linear.items()}
    shipped.update({("swiglu", n, k): c for (n, k), c in gemv.TUNED.swiglu.items()})
    base = dict(shipped)
    for entry in args.base:
        shape, _, text = entry.partition("=")
        base[table_key(shape)] = parse_config(text)
    runs = []

    def apply(table: dict) -> None:
        """The model's GEMV tables: exactly `table`'s entries (the next capture runs them)."""
        model.fuse_projections(gemv_tables=gemv.GemvTables(
            linear={(n, k): c for (kind, n, k), c in table.items() if kind == "gemv"},
            swiglu={(n, k): c for (kind, n, k), c in table.items() if kind == "swiglu"}))

    def run(label: str, shape: str | None, cfg: gemv.GemvConfig | None, table: dict | None = None) -> None:
        chosen = dict(base if table is None else table)
        if shape is not None:
            chosen[table_key(shape)] = cfg
        apply(chosen)
        r = time_step(model, prompt, args.tokens, args.rounds)
        r.update(label=label, shape=shape, config=None if cfg is None else [cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps],
                 fraction_of_roofline=r["pipelined_tokens_per_s"] * r["bytes"] / bandwidth)
        runs.append(r)
        print(f"{label:28s} {r['pipelined_tokens_per_s']:7.1f} tok/s ({r['fraction_of_roofline']:.3f} of the roofline), "
              f"graph {r['graph_ms']:.3f} ms", flush=True)

    run("shipped", None, None, shipped)
    if args.base:
        run("base", None, None)
    for shape in shapes:
        if table_key(shape) not in shipped:
            print(f"{shape}: not in gemv.TUNED (cuBLAS in the step); skipped")
            continue
        for text in cands.get(shape, []):
            run(f"{shape} {text}", shape, parse_config(text))
        run("base" if args.base else "shipped", None, None)
    if args.base:
        run("shipped", None, None, shipped)
    apply(shipped)

    def dump(table: dict) -> dict:
        return {("swiglu:" if kind == "swiglu" else "") + f"{n}x{k}": [c.block_n, c.block_k, c.split_k, c.num_warps]
                for (kind, n, k), c in table.items()}

    if args.out:
        Path(args.out).write_text(json.dumps({"shape": args.shape, "context": args.context, "bandwidth": bandwidth,
                                              "shipped": dump(shipped), "base": dump(base), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
