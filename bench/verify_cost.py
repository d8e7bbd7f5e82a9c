"""Verify cost against the number of tree nodes for a real model on this machine: the input of
`--budget auto` (which combines it with the measured acceptance per tree rank).

    python -m bench.verify_cost --threads 1 --out bench/results/verify_cost_cpu.json   # embedded default

Times the pass the decoder runs (eager on the CPU; the CUDA-graph runner on a GPU) at a
256-token context, median of 5, with nodes never committed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch


from treeflash.models.loader import load_model
from treeflash.models.runner import CudaGraphRunner, EagerRunner
from treeflash.models.step import StepInput
from treeflash.spec.budget import runner_verify_timer

NODES = (1, 2, 4, 8, 16, 32, 64, 128)


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="bench/results/verify_cost_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, progress=False)
    model = loaded.model.fuse_projections()
    cache = model.new_cache(args.context + max(NODES) + 8)
    runner = CudaGraphRunner(model, cache) if model.device.type == "cuda" else EagerRunner(model, cache)
    prompt = torch.randint(0, model.config.vocab_size, (args.context,), device=model.device)
    runner.forward(StepInput.plain(prompt, 0), compute_logits=False)
    times = runner_verify_timer(runner, NODES, repeats=5)(cache.seq_len)
    one = times[1]
    rows = {n: {"ms": t * 1e3, "ratio_to_one_node": t / one} for n, t in sorted(times.items())}
    result = {"command": "python -m bench.verify_cost " + " ".join(sys.argv[1:]), "model": loaded.source,
              "device": str(model.device), "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "threads": torch.get_num_threads(), "context": args.context, "dtype": str(model.dtype),
              "load_average_1min": os.getloadavg()[0], "verify": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for n, r in rows.items():
        print(f"{n:4d} nodes: {r['ms']:8.1f} ms  ({r['ratio_to_one_node']:.2f}x one node)")


if __name__ == "__main__":
    main()
