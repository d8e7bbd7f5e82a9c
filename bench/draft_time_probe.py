"""Per-propose draft times and the --budget auto tuner's view on the GPU, on a random-weight
SmolLM2-135M-shaped target and a random 3-layer drafter (weights do not change times): greedy
synchronous steps (TREEFLASH_DEVICE_STEPS=0) and a sampled decode, each configuration in a
subprocess so that a device-side assert in one does not end the others. Written in stop 23, when
`--budget auto` measured "a draft costs 11.9 ms" (3.0 ms in stop 22) and a sampled CLI bench hit
a NaN probability.

    python bench/draft_time_probe.py --out draft_time_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import build_model, random_drafter  # noqa: E402


@torch.inference_mode()
def one(budget: str, temperature: float, folded: int | None, reference_topk: bool, tokens: int) -> dict:
    from treeflash.models.runner import CudaGraphRunner
    from treeflash.spec import dflash_graph
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams
    from treeflash.train.evaluate import BUCKETS

    if reference_topk:
        from treeflash.kernels import topk

        dflash_graph.topk_logprobs = topk.topk_logprobs_reference
    model = build_model("smollm2-135m").fuse_projections(None, folded)
    b = "auto" if budget == "auto" else int(budget)
    drafter = random_drafter(model, 3, 16, budget=b, tree=True)
    cache = model.new_cache(600)
    runner = CudaGraphRunner(model, cache, capture_layers=drafter.capture_layers, buckets=BUCKETS)
    drafter.bind_runner(runner)
    times: list[float] = []
    real = drafter.propose

    def propose(ctx):
        tree = real(ctx)
        times.append(round(1e3 * drafter._last[1], 3) if drafter._last else -1.0)
        return tree

    drafter.propose = propose
    out = {"budget": budget, "temperature": temperature, "folded_rows": model.folded_rows, "reference_topk": reference_topk}
    for request in range(2):
        params = SamplingParams(temperature=temperature, seed=request)
        dec = Decoder(model, cache, params, drafter, runner=runner, generator=torch.Generator(device="cuda").manual_seed(request))
        prompt = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(request)).tolist()
        t0 = time.perf_counter()
        toks = [dec.prefill(prompt)]
        while len(toks) < tokens:
            toks.extend(dec.step())
        torch.cuda.synchronize()
        out[f"request{request}"] = {"s": round(time.perf_counter() - t0, 4), "tau": round(dec.stats.tau, 3),
                                    "draft_ms": times[:40], "slowest_ms": sorted(times)[-5:]}
        times.clear()
    if drafter.tuner is not None:
        out["tuner"] = drafter.tuner.reason
    out["nan_free"] = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="draft_time_probe.json")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # budget,temperature,folded,reference_topk (a child)
    args = p.parse_args()
    if args.one:
        b, t, f, r = args.one.split(",")
        print(json.dumps(one(b, float(t), None if f == "default" else int(f), r == "1", args.tokens)))
        return
    configs = ["auto,0,default,0", "auto,0,default,1", "auto,0,0,0", "48,0,default,0",
               "auto,1,default,0", "auto,1,0,0", "48,1,default,0", "48,1,0,1"]
    results = []
    for c in configs:
        env = {**os.environ, "TREEFLASH_DEVICE_STEPS": "0" if c.split(",")[1] == "0" else "1"}
        proc = subprocess.run([sys.executable, __file__, "--one", c, "--tokens", str(args.tokens)], env=env,
                              capture_output=True, text=True, timeout=300)
        line = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None
        row = json.loads(line) if line else {"config": c, "rc": proc.returncode, "error": proc.stderr[-1500:]}
        results.append(row)
        print(c, json.dumps(row)[:600], flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
