"""What one speculative step costs on the GPU once the host is out of the way: the graphs of the
evaluation's decoders on a random-weight SmolLM2-135M-shaped target with a random 3-layer block-16
drafter (speed does not depend on the weights), each replayed N times back to back:

    decode        the plain decode graph (one token)
    verify-16     the target's verify graph at 16 nodes (the chain's bucket)
    draft         the drafter's pass graph over 16 new rows
    device-chain  DeviceStep's whole chain step (draft + verify + accept + next state; spec/device_step.py)
    device-ddtree-N  the same with a DDTree of N nodes built on the device (kernels/spec/ddtree.py) and its commit
    device-ddtree-N-sampled  the same for a sampled request with top-k / top-p (the sort of every node's
                             distribution, then a draw at every node)
    device-ddtree-N-sampled-nosort  a sampled request with neither (temperature, min-p): kernels/spec/sample.py

Per graph: the host's enqueue time per replay and the elapsed GPU time per replay (CUDA events around
the N replays; when the host enqueues faster than the GPU runs, this is the GPU's time), and the
kernels one replay runs (torch.profiler), so that time / kernels says whether a graph is bound by
bytes or by the number of kernels.

    python -m bench.device_step_time --out device_step_time.json
"""

from __future__ import annotations

import argparse
import os
import json
import time
from pathlib import Path

import torch

from bench.gpu_shapes import DEV, build_model, random_drafter, sync


def timed(fn, n: int) -> dict:
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    if DEV == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t0
    if DEV == "cuda":
        b.record()
        b.synchronize()
        elapsed = a.elapsed_time(b) / 1000
    else:
        elapsed = time.perf_counter() - t0
    out = {"host_ms_per_replay": round(1e3 * host / n, 4), "elapsed_ms_per_replay": round(1e3 * elapsed / n, 4)}
    out.update(kernels(fn))
    return out


def kernels(fn) -> dict:
    if DEV != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name]
    names: dict[str, int] = {}
    busy: dict[str, float] = {}
    for e in evs:
        names[e.name[:70]] = names.get(e.name[:70], 0) + 1
        busy[e.name[:70]] = busy.get(e.name[:70], 0.0) + e.device_time_total
    # busy_us: the kernels' own durations summed (the rest of a replay is the gaps between them)
    return {"kernels": len(evs), "kernel_names": dict(sorted(names.items(), key=lambda kv: -kv[1])),
            "busy_us": round(sum(busy.values()), 1),
            "kernel_us": {k: round(v, 1) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])}}


@torch.inference_mode()
def measure(max_len: int, ctx: int, n: int, trees: list[int], folded_rows: int | None = None,
            greedy_only: bool = False) -> dict:
    from treeflash.models.runner import CudaGraphRunner
    from treeflash.spec.device_step import DeviceStep
    from treeflash.train.evaluate import BUCKETS

    model = build_model("smollm2-135m").fuse_projections(folded_rows)  # as the loader leaves a model (None)
    drafter = random_drafter(model, 3, 16, budget=15, tree=False)
    cache = model.new_cache(max_len)
    runner = CudaGraphRunner(model, cache, capture_layers=drafter.capture_layers, buckets=BUCKETS)
    drafter.bind_runner(runner)
    chain = DeviceStep(runner, drafter, 16)
    cache.reset()
    drafter.reset()
    cache.seq_len = ctx  # a mid-sequence context; the replays write scratch rows past it
    runner.ints[3 * runner.buckets[-1]] = ctx
    g = drafter.graphs
    g.ints[0] = ctx
    res = {"folded_rows": model.folded_rows}
    res["decode"] = timed(runner.decode.replay, n)
    res["verify-16"] = timed(runner.graphs[16].replay, n)
    res["draft"] = timed(g.passes[16].replay, n)
    chain.state.copy_(torch.tensor([ctx, 1, 16]))

    def step():
        chain.state[0:1].fill_(ctx)  # stay mid-sequence (one more tiny kernel per step)
        g.ints[0:1].fill_(ctx)
        chain.replay()

    res["device-chain"] = timed(step, n)
    names = ["decode", "verify-16", "draft", "device-chain"]
    for b in trees:  # a tree drafter over the same model, its own runner (the target's graphs are per runner)
        tree_drafter = random_drafter(model, 3, 16, budget=b, tree=True)
        tcache = model.new_cache(max_len)
        trunner = CudaGraphRunner(model, tcache, capture_layers=tree_drafter.capture_layers, buckets=BUCKETS)
        tree_drafter.bind_runner(trunner)
        tg = tree_drafter.graphs
        for sampled, filtered in ((False, False),) + (() if greedy_only else ((True, True), (True, False))):  # greedy, sampled (sorting / not)
            tstep = DeviceStep(trunner, tree_drafter, b + 1, sampled=sampled, filtered=filtered)
            tcache.reset()
            tree_drafter.reset()
            tstep.state.copy_(torch.tensor([ctx, 1, 16]))

            def tree_step(tstep=tstep, tg=tg):
                tstep.state[0:1].fill_(ctx)
                tg.ints[0:1].fill_(ctx)
                tstep.replay()

            name = f"device-ddtree-{b}" + ("-sampled" if sampled else "") + ("-nosort" if sampled and not filtered else "")
            res[name] = timed(tree_step, n)
            names.append(name)
    for k in names:
        r = res[k]
        per = f", {1e3 * r['elapsed_ms_per_replay'] / r['kernels']:.2f} us/kernel" if r.get("kernels") else ""
        print(f"{k:>13} (folded_rows {model.folded_rows}, max_len {max_len}): host {r['host_ms_per_replay']:.3f} ms, "
              f"elapsed {r['elapsed_ms_per_replay']:.3f} ms per replay, {r.get('kernels', '-')} kernels{per}", flush=True)
    for k in names:
        if "kernel_us" in res[k]:
            print(f"  {k}: kernels busy {res[k]['busy_us']:.0f} us;", list(res[k]["kernel_us"].items())[:12], flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--max-len", type=int, default=600, help="the cache's length (the evaluation's: prompt + 256 + 80)")
    p.add_argument("--context", type=int, default=300, help="committed tokens before the timed steps")
    p.add_argument("--folded-rows", default="default", help="CausalLM.folded_rows values to compare, e.g. default,0 "
                   "(default: what fuse_projections chooses, FOLDED_ROWS at this shape; 0: the norms as launches of their own)")
    p.add_argument("--trees", default="22,32", help="DDTree budgets of device steps to time beside the chain")
    p.add_argument("--greedy-only", action="store_true", help="time only the greedy DDTree steps (not the sampled ones)")
    p.add_argument("--out", default="device_step_time.json")
    args = p.parse_args()
    res = {"shape": "smollm2-135m", "drafter": "3 layers, block 16",
           "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
           "replays": args.replays, "max_len": args.max_len, "context": args.context,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("PYTORCH_TUNABLEOP", "TORCH_BLAS"))}, "runs": []}
    for fo in (None if x == "default" else int(x) for x in args.folded_rows.split(",")):
        res["runs"].append(measure(args.max_len, args.context, args.replays, [int(b) for b in args.trees.split(",") if b], fo,
                                   args.greedy_only))
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
