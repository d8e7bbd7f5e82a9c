"""Where do the non-finite probabilities of a sampled synchronous step come from?

`treeflash bench --temperature 1 --draft dflash` with synchronous steps (TREEFLASH_DEVICE_STEPS=0)
aborted on the H200 with "probability tensor contains either inf, nan or element < 0" in the
verifier's multinomial (stop 23, again in stop 24: bench/results/s24/bisect_sync.log). This runs the
same decoding as that bench (the default model and drafter, budget auto, the CLI's cache size, chat
prompts, temperature 1) through the same runner, and checks every tensor on the way:

- the drafter's logits at each synchronous propose,
- the target's verify logits and captured hidden states, row by row (real nodes only),
- the budget tuner's timing passes (when, at which context length),

and writes the first failure with its context (step, nodes, bucket, seq_len, max_len, bad rows, the
tree) to JSON.

Stop 24: on the H200 this ran 18 sampled sequences clean (bench/results/s24/sampled_nan_probe_alone.json):
it builds one runner on the model, as the evaluation does. The abort needed a second Engine on the same
model (treeflash bench's plain baseline), whose fuse_projections freed the folded weights under the
first engine's graphs; bench/cli_auto_probe.py, which runs treeflash bench itself, caught it.

    TREEFLASH_DEVICE_STEPS=0 python bench/sampled_nan_probe.py --model SmolLM2-135M-Instruct.Q4_1.gguf --out probe.json
    python bench/sampled_nan_probe.py --model ... --device cpu --static   # the graph runner's static code on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash.data.prompts import load_prompts  # noqa: E402
from treeflash.data.prompts import encode_prompt  # noqa: E402
from treeflash.models.default_model import default_drafter_path  # noqa: E402
from treeflash.models.loader import load_model  # noqa: E402
from treeflash.models.runner import CudaGraphRunner  # noqa: E402
from treeflash.spec import decoder as decoder_mod  # noqa: E402
from treeflash.spec.decoder import Decoder  # noqa: E402
from treeflash.spec.dflash import DFlashDrafter  # noqa: E402
from treeflash.spec.dflash_model import load_dflash  # noqa: E402
from treeflash.spec.sampling import SamplingParams  # noqa: E402


class Failure(Exception):
    pass


def bad_rows(t: torch.Tensor) -> list[int]:
    return torch.nonzero(~torch.isfinite(t.float()).all(dim=-1)).flatten().tolist()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--static", action="store_true", help="on the CPU: the graph runner's static code, uncaptured")
    p.add_argument("--prompts", default="chat")
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--budget", default="auto")
    p.add_argument("--seeds", type=int, default=3, help="passes over the prompts, seed = pass * 1000 + prompt")
    p.add_argument("--out", default="sampled_nan_probe.json")
    args = p.parse_args()

    loaded = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype), progress=False)
    model = loaded.model
    draft = load_dflash(args.drafter or default_drafter_path(), model.device, model.dtype)
    budget = args.budget if args.budget == "auto" else int(args.budget)
    drafter = DFlashDrafter(model, draft, budget=budget, tree=True)
    prompts = load_prompts(args.prompts, args.num_prompts)
    ids = [encode_prompt(loaded, q) for q in prompts]
    max_context = max(len(i) for i in ids) + args.max_tokens + 256  # as treeflash bench sizes it
    cache = model.new_cache(max_context + 1)
    runner = None
    if model.device.type == "cuda" or args.static:
        runner = CudaGraphRunner(model, cache, capture_layers=drafter.capture_layers, use_graphs=model.device.type == "cuda")
        drafter.bind_runner(runner)
    eos = set(loaded.config.eos_token_ids)
    log: list[dict] = []
    state = {"step": 0, "prompt": -1, "seed": -1}

    if drafter.tuner is not None:  # the tuner's timing passes: when and where
        measure = drafter.tuner.measure

        def logged_measure(context_len):
            t = measure(context_len)
            log.append({"event": "tuner_measure", "prompt": state["prompt"], "step": state["step"], "context_len": context_len,
                        "seq_len": cache.seq_len, "times": {str(k): v for k, v in t.items()}})
            return t

        drafter.tuner.measure = logged_measure

    tree_logprobs = drafter._tree_logprobs

    def checked_tree_logprobs(logits, ctx):
        rows = bad_rows(logits)
        if rows:
            raise Failure(json.dumps({"where": "drafter logits", "rows": rows, "step": state["step"], "seq_len": cache.seq_len}))
        return tree_logprobs(logits, ctx)

    drafter._tree_logprobs = checked_tree_logprobs
    verify = decoder_mod.verify

    def checked_verify(tree, logits, params, generator, argmax=None):
        n = tree.num_nodes
        rows = bad_rows(logits[:n])
        if rows:
            info = {"where": "target verify logits", "step": state["step"], "prompt": state["prompt"], "seed": state["seed"],
                    "nodes": n, "bucket": getattr(runner, "_last_bucket", None), "seq_len": cache.seq_len,
                    "max_len": cache.max_len, "bad_rows": rows, "nan_rows": torch.nonzero(logits[:n].isnan().any(-1)).flatten().tolist(),
                    "token_ids": tree.token_ids.tolist(), "parents": list(tree.parents), "depths": tree.depths(),
                    "finite_max_abs": float(torch.nan_to_num(logits[:n].float(), nan=0, posinf=0, neginf=0).abs().max())}
            raise Failure(json.dumps(info))
        return verify(tree, logits, params, generator, argmax=argmax)

    decoder_mod.verify = checked_verify
    report = {"model": args.model, "device": args.device, "dtype": args.dtype, "static": args.static, "max_context": max_context,
              "env": {k: v for k, v in os.environ.items() if k.startswith("TREEFLASH_")}, "runs": [], "failure": None}
    t0 = time.perf_counter()
    try:
        for seed_pass in range(args.seeds):
            for i, prompt_ids in enumerate(ids):
                state.update(prompt=i, seed=seed_pass * 1000 + i, step=0)
                params = SamplingParams(temperature=args.temperature, seed=state["seed"])
                gen = params.generator(model.device if model.device.type == "cuda" else "cpu")
                dec = Decoder(model, cache, params, drafter, generator=gen, runner=runner)
                out = [dec.prefill(prompt_ids)]
                while len(out) < args.max_tokens and not eos.intersection(out):
                    out.extend(dec.step())
                    state["step"] += 1
                report["runs"].append({"prompt": i, "seed": state["seed"], "tokens": len(out), "passes": dec.stats.passes,
                                       "tau": dec.stats.as_dict()["tau"]})
                print(f"[probe] prompt {i} seed {state['seed']}: {len(out)} tokens, tau {dec.stats.as_dict()['tau']}", flush=True)
    except Failure as f:
        report["failure"] = json.loads(str(f))
        print(f"[probe] FAILURE {str(f)[:2000]}", flush=True)
    report["events"] = log[-40:]
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"[probe] wrote {args.out}; failure: {report['failure'] is not None}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
