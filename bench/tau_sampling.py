"""tau of the default pair per temperature and sampled-tree verification rule, on real weights.

    python -m bench.tau_sampling --out bench/results/tau_sampling_cpu.json
    python -m bench.tau_sampling --num-prompts 2 --max-tokens 16 --out /tmp/tau.json   # a quick check
    python -m bench.tau_sampling --num-prompts 20 --max-tokens 512 --device cuda --out tau_sampling_gpu.json

The embedded default target (SmolLM2-135M-Instruct, fp32) and its shipped DFlash drafter
(treeflash/assets/smollm2_dflash) at a fixed DDTree budget, on held-out prompts (train/prompts.py
`heldout_prompts`: the drafter never trained on them; half HumanEval, half chat, interleaved). Every
configuration decodes every prompt for exactly --max-tokens tokens (EOS ignored) through the
synchronous Decoder; tau = tokens committed per target pass, pooled over the prompts (and per prompt).

Configurations: greedy, then temperatures 0.6 / 0.8 / 1.0 without filters and 0.8 with top-p 0.9 and
with top-k 20, each under both lossless sampled-tree rules (spec/verify.py): "match" (the drafter's
deterministic top-k children, sample-and-match) and "rejection" (children drawn from the drafter's q
without replacement, recursive rejection). Sampled runs use seed = prompt index, so the two rules see
the same prompts and seeds (not the same draws: they consume randomness differently).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from treeflash.bench.machine import machine, versions
from treeflash.data.prompts import encode_prompt
from treeflash.models.loader import load_model
from treeflash.spec.decoder import Decoder
from treeflash.spec.drafter import DraftOptions, build_drafter
from treeflash.spec.sampling import SamplingParams
from treeflash.train.prompts import heldout_prompts

# (label, temperature, top_p, top_k)
SETTINGS = (
    ("T=0.6", 0.6, 1.0, 0),
    ("T=0.8", 0.8, 1.0, 0),
    ("T=1.0", 1.0, 1.0, 0),
    ("T=0.8 top-p 0.9", 0.8, 0.9, 0),
    ("T=0.8 top-k 20", 0.8, 1.0, 20),
)
RULES = ("match", "rejection")


def pick_prompts(n: int):
    """n held-out prompts alternating HumanEval and chat (as many of each as there are)."""
    held = heldout_prompts()
    code = [p for p in held if p.name.startswith("humaneval/")]
    chat = [p for p in held if not p.name.startswith("humaneval/")]
    out = []
    for i in range(max(len(code), len(chat))):
        out.extend(x[i] for x in (code, chat) if i < len(x))
    return out[:n]


def decode(model, drafter, ids: list[int], params: SamplingParams, max_tokens: int) -> dict:
    gen = params.generator(model.device)  # on the device the draws run on, as the engine does
    dec = Decoder(model, model.new_cache(len(ids) + max_tokens + 80), params, drafter, generator=gen)
    out = [dec.prefill(ids)]
    t0 = time.perf_counter()
    while len(out) < max_tokens:
        out.extend(dec.step())
    s = dec.stats
    return {"passes": s.passes, "committed": s.committed, "decode_s": round(time.perf_counter() - t0, 3),
            "acceptance_per_depth": [round(a, 4) for a in s.acceptance_per_depth()]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--num-prompts", type=int, default=8, help="held-out prompts (alternating code / chat), default 8")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens decoded per prompt, default 96")
    ap.add_argument("--budget", type=int, default=32, help="the DDTree budget (draft nodes), default 32")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads, default 1 (a shared machine)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="default cpu (fp32 either way; eager steps)")
    args = ap.parse_args(argv)
    if not 1 <= args.num_prompts <= 20:
        ap.error(f"--num-prompts must be in [1, 20], got {args.num_prompts}")
    if args.max_tokens < 2 or args.budget < 1 or args.threads < 1:
        ap.error("--max-tokens must be >= 2, --budget and --threads >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_model(None, device=args.device, dtype=torch.float32, progress=False)
    drafter = build_drafter("dflash", loaded, DraftOptions(budget=args.budget))
    prompts = pick_prompts(args.num_prompts)
    ids = [encode_prompt(loaded, p) for p in prompts]
    configs = [("greedy", SamplingParams(), None)]
    for label, t, top_p, top_k in SETTINGS:
        for rule in RULES:
            configs.append((label, SamplingParams(temperature=t, top_p=top_p, top_k=top_k, tree_sampling=rule), rule))
    rows = []
    started = time.perf_counter()
    for label, params, rule in configs:
        per_prompt = []
        for i, (p, x) in enumerate(zip(prompts, ids)):
            seeded = SamplingParams(**{**params.__dict__, "seed": i}) if not params.greedy else params
            r = decode(loaded.model, drafter, x, seeded, args.max_tokens)
            per_prompt.append({"prompt": p.name, **r, "tau": round(r["committed"] / r["passes"], 4)})
        passes = sum(r["passes"] for r in per_prompt)
        committed = sum(r["committed"] for r in per_prompt)
        rows.append({"setting": label, "rule": rule, "temperature": params.temperature, "top_p": params.top_p,
                     "top_k": params.top_k, "tau": round(committed / passes, 4), "passes": passes,
                     "committed": committed, "per_prompt": per_prompt})
        print(f"{label:18s} {rule or '-':9s} tau {committed / passes:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    result = {
        "tool": "bench.tau_sampling", "machine": machine(), "versions": versions(),
        "target": "SmolLM2-135M-Instruct Q4_1 GGUF (embedded default), fp32", "drafter": "treeflash/assets/smollm2_dflash",
        "budget": args.budget, "max_tokens": args.max_tokens, "threads": args.threads, "device": args.device, "prompts": [p.name for p in prompts],
        "note": "tau = tokens committed per target pass, pooled over prompts; prompts held out from the drafter's training",
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
