"""Per-pass draft / verify / rest time of the evaluation's decoders (chain, DDTree budgets) on a
random-weight SmolLM2-135M-shaped target with a random 3-layer block-16 drafter, CUDA graphs, as
`python -m treeflash.train.evaluate` builds them (no acceptance with random weights: each pass commits
one token, so only the per-pass costs mean anything). Written in stop 20 to find why the chain's and
DDTree-32's drafting passes cost more than DDTree-8's on the H200 while the draft graph alone does not
(bench/draft_topk.py).

    python bench/spec_draft_time.py --out spec_draft_time.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import build_model, random_drafter, sync  # noqa: E402


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="chain,8,22,32")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="spec_draft_time.json")
    args = p.parse_args()
    from treeflash.models.runner import CudaGraphRunner
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams
    from treeflash.train.evaluate import BUCKETS

    model = build_model("smollm2-135m")
    prompt = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    res = {}
    configs = []
    for b in args.budgets.split(","):
        d = random_drafter(model, 3, 16, budget=15 if b == "chain" else int(b), tree=b != "chain")
        cache = model.new_cache(1024)
        runner = CudaGraphRunner(model, cache, capture_layers=d.capture_layers, buckets=BUCKETS)
        d.bind_runner(runner)
        configs.append((b, d, cache, runner))
    for r in range(args.rounds):
        for b, d, cache, runner in configs:
            cache.reset()
            d.reset()
            dec = Decoder(model, cache, SamplingParams(), d, runner=runner)
            out = [dec.prefill(prompt)]
            sync()
            t0 = time.perf_counter()
            while len(out) < args.tokens:
                out.extend(dec.step())
            sync()
            wall = time.perf_counter() - t0
            s = dec.stats
            n = max(s.passes, 1)
            row = {"passes": s.passes, "draft_ms": s.draft_s / n * 1e3, "verify_ms": s.verify_s / n * 1e3,
                   "rest_ms": s.rest_s / n * 1e3, "wall_ms_per_pass": wall / n * 1e3, "top_k": d.graphs.top_k}
            res.setdefault(b, []).append(row)
            print(f"[round {r}] {b:>5}: " + " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
