"""Decode evaluation of a trained drafter: tau and wall-clock speedup against plain decoding.

    python -m treeflash.train.evaluate --target MODEL --drafter DIR --out eval.json

On the held-out prompts (prompts.heldout_prompts: 10 HumanEval + 10 chat, never trained on),
greedy, with treeflash's own Decoder: plain decoding, the DFlash chain, and DDTree at several
budgets. Runs are interleaved prompt by prompt in alternating order (ABBA), so drift of the
machine lands on every configuration alike; the speedup is plain decode time / this decode
time over the same prompts (and tokens_per_s_vs_plain the ratio of rates, which differs when bf16
outputs, and so their lengths, differ). Every speculative output is compared token by token with the plain
one (lossless at temperature 0; in bf16 a different batch shape can flip a near-tie, which the
report counts rather than hides). The JSON is rewritten after every prompt, so an interrupted
run still leaves its partial results.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from treeflash.spec.stats import SpecStats

DEFAULT_BUDGETS = (8, 16, 22, 32)
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Config:
    name: str
    drafter: object | None  # a DFlashDrafter, or None for plain decoding
    runner: object | None = None
    cache: object | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    decode_s: float = 0.0
    prefill_s: float = 0.0
    tokens: int = 0
    identical: int = 0
    first_mismatch: list = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(model, cfg: Config, prompt_ids: list[int], max_tokens: int, eos: set[int]):
    """-> (tokens cut at max_tokens / the first end token, prefill seconds, decode seconds, stats)."""
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams

    dec = Decoder(model, cfg.cache, SamplingParams(), cfg.drafter, runner=cfg.runner)
    _sync(model.device)
    t0 = time.perf_counter()
    out = [dec.prefill(prompt_ids)]
    _sync(model.device)
    t1 = time.perf_counter()
    while len(out) < max_tokens and not eos.intersection(out):
        out.extend(dec.step())
    _sync(model.device)
    t2 = time.perf_counter()
    out = out[:max_tokens]
    end = next((i for i, t in enumerate(out) if t in eos), None)
    return (out if end is None else out[: end + 1]), t1 - t0, t2 - t1, dec.stats


def build_configs(loaded, drafter_dir: str, budgets, graphs: bool, max_len: int) -> list[Config]:
    from treeflash.engine.stack import build_runner
    from treeflash.spec.dflash import DFlashDrafter
    from treeflash.spec.dflash_model import load_dflash

    model = loaded.model
    draft = load_dflash(drafter_dir, model.device, model.dtype)
    configs = [Config("plain", None), Config("chain", DFlashDrafter(model, draft, budget=draft.config.block_size - 1, tree=False))]
    configs += [Config(f"ddtree-{b}", DFlashDrafter(model, draft, budget=b, tree=True)) for b in budgets]
    for c in configs:
        c.cache = model.new_cache(max_len)
        if graphs:  # the drafter bound: its passes as CUDA graphs too (static code on a CPU)
            c.runner = build_runner(model, c.cache, c.drafter, buckets=BUCKETS)
    return configs


def summarize(configs: list[Config], runs: int) -> dict:
    plain = configs[0]

    def rate(c: Config) -> float:
        return c.tokens / max(c.decode_s, 1e-9)

    out = {}
    for c in configs:
        row = {
            "prompts": runs,
            "tokens": c.tokens,
            "decode_s": round(c.decode_s, 4),
            "decode_tokens_per_s": round(rate(c), 2),
            "speedup_vs_plain": round(plain.decode_s / max(c.decode_s, 1e-9), 3),
            # bf16 outputs can differ from plain's, and so can their lengths: the rate ratio as well
            "tokens_per_s_vs_plain": round(rate(c) / max(rate(plain), 1e-9), 3),
        }
        if c.drafter is not None:
            s = c.stats.as_dict()
            row.update(tau=s["tau"], acceptance_per_depth=s["acceptance_per_depth"], passes=s["passes"], time_split_s=s["time_s"],
                       identical_to_plain=f"{c.identical}/{runs}", first_mismatch=c.first_mismatch[:5])
            info = c.drafter.describe()
            row["budget"] = info.get("budget")
            if info.get("budget_mode") == "auto":
                row["budget_reason"] = info.get("budget_reason")
        out[c.name] = row
    return out


def evaluate(loaded, drafter_dir: str, prompts, out_path: Path, max_tokens: int = 256, budgets=DEFAULT_BUDGETS,
             graphs: bool | None = None, time_limit_s: float | None = None, progress: bool = True) -> dict:
    from treeflash.data.prompts import encode_prompt

    model = loaded.model
    dev = model.device
    graphs = dev.type == "cuda" if graphs is None else graphs
    eos = set(loaded.config.eos_token_ids) | ({loaded.tokenizer.eos_token_id} if loaded.tokenizer.eos_token_id is not None else set())
    encoded = [(p.name, encode_prompt(loaded, p)) for p in prompts]
    max_len = max(len(ids) for _, ids in encoded) + max_tokens + 80
    t_start = time.perf_counter()
    configs = build_configs(loaded, drafter_dir, budgets, graphs, max_len)
    for c in configs:  # warm up: kernels, cuBLAS handles, allocator
        decode(model, c, encoded[0][1], 16, eos)
    report: dict = {"target": loaded.source, "drafter": str(drafter_dir), "device": str(dev), "dtype": str(model.dtype),
                    "cuda_graphs": graphs, "max_tokens": max_tokens, "budgets": list(budgets), "prompts": [n for n, _ in encoded],
                    "setup_s": round(time.perf_counter() - t_start, 1), "complete": False}
    per_prompt = []
    for i, (name, ids) in enumerate(encoded):
        if time_limit_s is not None and time.perf_counter() - t_start > time_limit_s:
            report["stopped"] = f"time limit after {i} prompts"
            break
        order = configs if i % 2 == 0 else [configs[0], *reversed(configs[1:])]  # plain first: its output is the reference
        ref, row = None, {"prompt": name, "prompt_tokens": len(ids)}
        for c in order:
            toks, pre_s, dec_s, stats = decode(model, c, ids, max_tokens, eos)
            if ref is None:
                ref = toks
            c.prefill_s += pre_s
            c.decode_s += dec_s
            c.tokens += len(toks)
            if c.drafter is not None:
                c.stats.merge(stats)
                same = toks == ref
                c.identical += same
                if not same:
                    at = next((j for j, (a, b) in enumerate(zip(toks, ref)) if a != b), min(len(toks), len(ref)))
                    c.first_mismatch.append({"prompt": name, "at_token": at})
                row[c.name] = {"tau": round(stats.tau, 3), "decode_s": round(dec_s, 4), "identical": same}
            else:
                row[c.name] = {"tokens": len(toks), "decode_s": round(dec_s, 4)}
        per_prompt.append(row)
        report.update(results=summarize(configs, i + 1), per_prompt=per_prompt, elapsed_s=round(time.perf_counter() - t_start, 1))
        _write(out_path, report)
        if progress:
            print(f"[eval] {i + 1}/{len(encoded)} {name}: " + " ".join(
                f"{c.name}={row[c.name].get('tau', '-')}" for c in configs[1:]), flush=True)
    report["complete"] = "stopped" not in report
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    _write(out_path, report)
    return report


def _budget(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a budget is an integer or 'auto', got {value!r}") from None


def _write(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    from treeflash.models.loader import load_model
    from treeflash.train.prompts import heldout_prompts

    p = argparse.ArgumentParser(prog="python -m treeflash.train.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="the target (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", required=True, help="the trained drafter directory")
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--budgets", type=_budget, nargs="+", default=list(DEFAULT_BUDGETS),
                   help="DDTree node budgets, integers or 'auto' (the tuner of --budget auto; its pick is reported)")
    p.add_argument("--num-prompts", type=int, default=None, help="only the first N held-out prompts (after --skip)")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N held-out prompts (10 = the chat half only)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--time-limit", type=float, default=None, help="stop starting new prompts after this many seconds")
    args = p.parse_args(argv)
    loaded = load_model(args.target, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None, progress=False)
    if loaded.model.device.type == "cuda":
        loaded.model.fuse_projections()
    prompts = heldout_prompts()[args.skip :]
    prompts = prompts[: args.num_prompts] if args.num_prompts is not None else prompts
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        report = evaluate(loaded, args.drafter, prompts, out, args.max_tokens, tuple(args.budgets),
                          graphs=False if args.eager else None, time_limit_s=args.time_limit)
    for name, row in report.get("results", {}).items():
        print(f"[eval] {name:>10}: tau {row.get('tau', 1.0):>5} speedup {row['speedup_vs_plain']:>6}x "
              f"{row['decode_tokens_per_s']:>8} tok/s ({row['tokens_per_s_vs_plain']}x) identical {row.get('identical_to_plain', '-')}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
