"""The host's share of a speculative step: everything but the graph replays, timed on this machine.

    python bench/spec_host_overhead.py --budgets chain 8 22 32 --steps 400 --out host_overhead.json

On the H200 a DFlash step is: the drafter's graph, a read-back, the tree built on the host, the
verify inputs filled and uploaded, the verify graph, the argmax read back, the walk, the commit
graph. The host work between the replays is on the critical path (the GPU waits for it), and the
H200 machine's host is slow. This script measures that host work alone: a tiny random target and
drafter (block 16) decode through the static-shape runner and the drafter's static passes (the code CUDA
graphs capture, run eagerly on the CPU), then every replay (target verify and commit, drafter
passes) is swapped for a no-op that leaves its last outputs in place, and `Decoder.step()` is timed.
What remains is the Python and host-tensor work a real step does around its graphs.

Figures are this machine's; the H200's host is slower per operation (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def build(budget: str, seed: int = 0):
    """A tiny random qwen3 target (8 layers) and a random 2-layer drafter of block 16."""
    from treeflash.models.config import ModelConfig
    from treeflash.models.runner import CudaGraphRunner
    from treeflash.models.transformer import CausalLM
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.dflash import DFlashDrafter
    from treeflash.spec.dflash_model import DFlashModel
    from treeflash.spec.sampling import SamplingParams
    from treeflash.train.recipe import drafter_config
    from treeflash.train.trainer import init_weights

    torch.manual_seed(seed)
    cfg = ModelConfig.from_hf_dict({"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                                    "max_position_embeddings": 8192})
    target = CausalLM(cfg).eval()
    for prm in target.parameters():
        prm.data.normal_(0, 0.3)
    model = DFlashModel(drafter_config(cfg, 2, 16, 511)).eval()
    init_weights(model, seed)
    tree = budget != "chain"
    b = int(budget) if tree else model.config.block_size - 1
    cache = target.new_cache(4096)
    drafter = DFlashDrafter(target, model, budget=b, tree=tree)
    runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(runner)
    return target, drafter, runner, Decoder(target, cache, SamplingParams(), drafter, runner=runner)


def freeze_replays(runner, drafter) -> None:
    """Every replay becomes a no-op; the outputs of its last real run stay in its buffers."""
    for g in runner.graphs.values():
        g.replay = lambda: None
        g.commit = lambda: None
    if runner.decode is not None:
        runner.decode.replay = lambda: None
    for p in drafter.graphs.passes.values():
        p.replay = lambda: None


def measure(budget: str, steps: int, repeats: int) -> dict:
    target, drafter, runner, dec = build(budget)
    prompt = list(range(3, 40))
    with torch.inference_mode():
        dec.prefill(prompt)
        for _ in range(40):  # real steps: every bucket and draft pass has outputs
            dec.step()
        freeze_replays(runner, drafter)
        from treeflash.spec.stats import SpecStats

        dec.stats = SpecStats()  # the timed steps only
        times = []
        for _ in range(repeats):
            dec.prefill(prompt)
            t0 = time.perf_counter()
            for _ in range(steps):
                dec.step()
            times.append((time.perf_counter() - t0) / steps)
    s = dec.stats
    return {"budget": budget, "steps": steps, "repeats": repeats, "host_us_per_step_median": round(1e6 * statistics.median(times), 1),
            "host_us_per_step_min": round(1e6 * min(times), 1),
            "split_us_per_step": {k: round(1e6 * v / max(s.passes, 1), 1) for k, v in s.as_dict()["time_s"].items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", nargs="+", default=["chain", "8", "22", "32"], help="chain or DDTree node budgets")
    p.add_argument("--steps", type=int, default=300, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON report")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for b in args.budgets:
        row = measure(b, args.steps, args.repeats)
        rows.append(row)
        print(f"[host] {b:>5}: {row['host_us_per_step_median']} us a step (min {row['host_us_per_step_min']}); "
              f"split {row['split_us_per_step']}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": "cpu (this machine)", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
