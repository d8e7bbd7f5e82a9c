"""Whether graphed verify steps give finite logits at every node count the CLI's runner serves
(buckets up to 128, an 8193-slot cache), with the folded-norm layers and without, on a random-weight
SmolLM2-135M-shaped bf16 target; then sampled decodes (DFlash, random drafter) on each. Written in
stop 23 after a sampled `treeflash bench` on the H200 hit a NaN probability in a synchronous verify.

    python bench/verify_finite_check.py --out verify_finite_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import build_model, random_drafter  # noqa: E402


@torch.inference_mode()
def check(folded: int) -> dict:
    from treeflash.models.runner import CudaGraphRunner
    from treeflash.models.step import StepInput
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams

    model = build_model("smollm2-135m").fuse_projections(None, folded)
    cache = model.new_cache(8193)
    runner = CudaGraphRunner(model, cache)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 49152, (40,), generator=gen).cuda()
    runner.forward(StepInput.plain(prompt, 0))
    out = {"folded_rows": model.folded_rows}
    for n in (2, 17, 33, 49, 64, 65, 100, 128):
        ids = torch.randint(0, 49152, (n,), generator=gen).cuda()
        parents = [-1] + [max(0, i - 1 - (i % 3 == 0)) for i in range(1, n)]
        res = runner.forward(StepInput.tree(ids, parents, cache.seq_len))
        lg = res.logits[:n].float()
        bad = (~torch.isfinite(lg)).any(-1)
        out[f"verify_{n}"] = {"finite": bool(not bad.any()), "bad_rows": bad.nonzero().flatten().tolist()[:10],
                              "max_abs": float(lg[~bad].abs().max()) if (~bad).any() else None}
        runner.commit([0])  # keep the root only: the next verify starts one token later
    for budget in (48, "auto"):
        drafter = random_drafter(model, 3, 16, budget=budget, tree=True)
        c2 = model.new_cache(8193)
        r2 = CudaGraphRunner(model, c2, capture_layers=drafter.capture_layers)
        drafter.bind_runner(r2)
        try:
            for seed in range(3):
                dec = Decoder(model, c2, SamplingParams(temperature=1.0, seed=seed), drafter, runner=r2,
                              generator=torch.Generator(device="cuda").manual_seed(seed))
                toks = [dec.prefill(torch.randint(0, 49152, (40,), generator=gen).tolist())]
                while len(toks) < 96:
                    toks.extend(dec.step())
            torch.cuda.synchronize()
            out[f"sampled_{budget}"] = "ok"
        except Exception as e:  # noqa: BLE001 - reported
            out[f"sampled_{budget}"] = f"{type(e).__name__}: {e}"[:300]
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="verify_finite_check.json")
    p.add_argument("--folded", default="128,0")
    args = p.parse_args()
    res = []
    for f in args.folded.split(","):
        res.append(check(int(f)))
        print(json.dumps(res[-1]), flush=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
