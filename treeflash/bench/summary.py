"""From run records to figures: per-pass aggregates, mean and spread over passes, speedup, checks.

Per pass, a target's tokens/s is token-weighted over the prompts (total tokens / total time;
decode figures leave out the first token and the time to it),
tau is total committed tokens / total target passes, and acceptance at depth d is the number of
verify passes that accepted a node at depth d over those whose tree reached depth d (exact
counts, not a mean of rates). The speedup is paired pass by pass (baseline and speculative runs
of the same pass ran interleaved), then averaged.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from treeflash.bench.runner import RunRecord

COLLAPSE_DROP = 0.15  # a run more than 15% below the first run of the same target and prompt


def spread(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "stdev": None, "min": None, "max": None, "n": 0}
    return {
        "mean": round(statistics.fmean(values), 4),
        "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def pass_figures(records: list[RunRecord]) -> dict:
    """Records of one target in one pass -> that pass's aggregate figures."""
    tokens = sum(r.completion_tokens for r in records)
    decode_tokens = sum(max(r.completion_tokens - 1, 0) for r in records)
    decode_s = sum(r.decode_s for r in records)
    seconds = sum(r.seconds for r in records)
    out = {
        "decode_tps": decode_tokens / max(decode_s, 1e-9),
        "e2e_tps": tokens / max(seconds, 1e-9),
        "ttft_s": statistics.fmean(r.first_token_s for r in records),
        "tokens": tokens,
    }
    if all("decode_cpu_s" in r.extra for r in records):  # in-process: decode tokens per CPU-second of this process
        out["cpu_tps"] = decode_tokens / max(sum(r.extra["decode_cpu_s"] for r in records), 1e-9)
    specs = [r.spec for r in records if r.spec]
    if specs:
        passes = sum(s["passes"] for s in specs)
        out["tau"] = sum(s["committed"] for s in specs) / max(passes, 1)
        timed = [s["time_s"] for s in specs if "time_s" in s]  # servers may report tau without a time split
        if timed:
            for part in ("draft", "verify", "rest"):
                out[f"{part}_s"] = sum(t[part] for t in timed)
    return out


def by_target_pass(records: list[RunRecord]) -> dict[str, dict[int, list[RunRecord]]]:
    grouped: dict[str, dict[int, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[r.target][r.run].append(r)
    return grouped


def acceptance_per_depth(records: list[RunRecord]) -> list[float] | None:
    proposed: list[int] = []
    accepted: list[int] = []
    for r in records:
        if not r.spec or "proposed_per_depth" not in r.spec:
            continue
        for name, acc in (("proposed_per_depth", proposed), ("accepted_per_depth", accepted)):
            for i, v in enumerate(r.spec[name]):
                if i >= len(acc):
                    acc.append(0)
                acc[i] += v
    if not proposed:
        rates = [r.spec["acceptance_per_depth"] for r in records if r.spec and r.spec.get("acceptance_per_depth")]
        return [round(statistics.fmean(col), 4) for col in zip(*rates)] if rates else None  # no counts: mean of rates
    return [round(a / p, 4) if p else 0.0 for a, p in zip(accepted, proposed)]


def budget_figures(records: list[RunRecord]) -> dict | None:
    """The budget of every step (draft nodes, 0 = plain) over these runs: mean and steps per budget."""
    hist: dict[int, int] = {}
    for r in records:
        for b, n in ((r.spec or {}).get("budget") or {}).get("steps_per_budget", {}).items():
            hist[int(b)] = hist.get(int(b), 0) + n
    steps = sum(hist.values())
    if not steps:
        return None
    return {"mean": round(sum(b * n for b, n in hist.items()) / steps, 3),
            "steps_per_budget": {str(b): n for b, n in sorted(hist.items())}}


def auto_vs_fixed(configs: list[dict]) -> dict | None:
    """A sweep with budget 'auto' beside fixed budgets: auto's decode tokens/s over the best fixed one's
    (means over passes), and the same for tau."""
    auto = next((c for c in configs if c.get("sweep_value") == "auto"), None)
    fixed = [c for c in configs if isinstance(c.get("sweep_value"), int)]
    if auto is None or not fixed:
        return None
    best = max(fixed, key=lambda c: c["tokens_per_second"]["mean"] or 0.0)
    return {"auto": auto["label"], "best_fixed": best["label"],
            "tokens_per_second_ratio": round(auto["tokens_per_second"]["mean"] / best["tokens_per_second"]["mean"], 4),
            "auto_speedup_vs_baseline": (auto.get("speedup_vs_baseline") or {}).get("mean"),
            "best_fixed_speedup_vs_baseline": (best.get("speedup_vs_baseline") or {}).get("mean")}


def collapse_warnings(records: list[RunRecord], drop: float = COLLAPSE_DROP) -> list[dict]:
    """Runs whose decode tokens/s or tau fell more than `drop` below the first run (same target, prompt)."""
    first: dict[tuple[str, str], RunRecord] = {}
    warnings = []
    for r in sorted(records, key=lambda r: r.run):
        key = (r.target, r.prompt)
        if key not in first:
            first[key] = r
            continue
        f = first[key]
        metrics = [("tokens_per_second", f.decode_tps, r.decode_tps)]
        if f.spec and r.spec:
            metrics.append(("tau", f.spec["tau"], r.spec["tau"]))
        for name, was, now in metrics:
            if was > 0 and now < (1 - drop) * was:
                w = {"target": r.target, "prompt": r.prompt, "run": r.run, "metric": name,
                     "first": round(was, 4), "value": round(now, 4), "drop": round(1 - now / was, 4)}
                if name == "tokens_per_second" and "decode_cpu_s" in f.extra and "decode_cpu_s" in r.extra:
                    # the same drop in CPU time points at the code; none at all points at other tenants
                    w["cpu_time_drop"] = round(1 - f.extra["decode_cpu_s"] / max(r.extra["decode_cpu_s"], 1e-9), 4)
                warnings.append(w)
    return warnings


def identical_outputs(records: list[RunRecord], baseline: str, label: str) -> dict | None:
    """Token identity of `label` vs `baseline`, run by run; None when there are no token ids to compare."""
    base = {(r.prompt, r.run): r.token_ids for r in records if r.target == baseline}
    checked, mismatches = 0, []
    for r in records:
        other = base.get((r.prompt, r.run))
        if r.target != label or r.token_ids is None or other is None:
            continue
        checked += 1
        if r.token_ids != other:
            at = next((i for i, (a, b) in enumerate(zip(r.token_ids, other)) if a != b), min(len(r.token_ids), len(other)))
            mismatches.append({"prompt": r.prompt, "run": r.run, "first_difference_at": at})
    if not checked:
        return None
    return {"identical": not mismatches, "checked": checked, "mismatches": mismatches}


def summarize(records: list[RunRecord], labels: list[str], baseline: str | None = None,
              sweep_values: dict[str, object] | None = None, greedy: bool = True) -> dict:
    """labels: the targets in display order; baseline: the label to compare against (or None).

    Returns (summary, collapse warnings). The summary's top-level figures are the best target's
    (the fastest one other than the baseline); `configs` holds every target's spread."""
    grouped = by_target_pass(records)
    per_pass = {lab: {run: pass_figures(rs) for run, rs in sorted(grouped[lab].items())} for lab in labels}
    configs = []
    for lab in labels:
        passes = per_pass[lab]
        runs = list(passes.values())
        rs = [r for r in records if r.target == lab]
        c = {"label": lab, "runs": len(runs), "completion_tokens": sum(p["tokens"] for p in runs)}
        if sweep_values and lab in sweep_values:
            c["sweep_value"] = sweep_values[lab]
        for key, name in (("decode_tps", "tokens_per_second"), ("e2e_tps", "e2e_tokens_per_second"), ("ttft_s", "ttft_s")):
            c[name] = spread([p[key] for p in runs])
        if all("cpu_tps" in p for p in runs):
            c["tokens_per_cpu_second"] = spread([p["cpu_tps"] for p in runs])
        if any("tau" in p for p in runs):
            c["tau"] = spread([p["tau"] for p in runs if "tau" in p])
            c["acceptance_per_depth"] = acceptance_per_depth(rs)
            split = {part: sum(p.get(f"{part}_s", 0.0) for p in runs) for part in ("draft", "verify", "rest")}
            total = sum(split.values())
            c["time_split"] = {part: round(v / total, 4) for part, v in split.items()} if total else None
            c["budget"] = budget_figures(rs)
        if baseline is not None and lab != baseline:
            base = per_pass[baseline]
            paired = [run for run in passes if run in base]
            c["speedup_vs_baseline"] = spread([passes[k]["decode_tps"] / base[k]["decode_tps"] for k in paired])
            c["e2e_speedup_vs_baseline"] = spread([passes[k]["e2e_tps"] / base[k]["e2e_tps"] for k in paired])
            if "tokens_per_cpu_second" in c and all("cpu_tps" in base[k] for k in paired):
                c["cpu_speedup_vs_baseline"] = spread([passes[k]["cpu_tps"] / base[k]["cpu_tps"] for k in paired])
            c["outputs_vs_baseline"] = identical_outputs(records, baseline, lab) if greedy else None
        configs.append(c)
    candidates = [c for c in configs if c["label"] != baseline] or configs
    best = max(candidates, key=lambda c: c["tokens_per_second"]["mean"] or 0.0)
    warnings = collapse_warnings(records)
    identity = [c["outputs_vs_baseline"]["identical"] for c in configs if c.get("outputs_vs_baseline")]
    return {
        "best": best["label"],
        "best_sweep_value": best.get("sweep_value"),
        "tokens_per_second": best["tokens_per_second"]["mean"],
        "e2e_tokens_per_second": best["e2e_tokens_per_second"]["mean"],
        "ttft_s": best["ttft_s"]["mean"],
        "tau": best["tau"]["mean"] if "tau" in best else None,
        "speedup_vs_baseline": best["speedup_vs_baseline"]["mean"] if "speedup_vs_baseline" in best else None,
        "cpu_speedup_vs_baseline": best["cpu_speedup_vs_baseline"]["mean"] if "cpu_speedup_vs_baseline" in best else None,
        "baseline": baseline,
        "baseline_tokens_per_second": next((c["tokens_per_second"]["mean"] for c in configs if c["label"] == baseline), None),
        "outputs_identical": all(identity) if identity else None,
        "collapse_warnings": len(warnings),
        "auto_vs_best_fixed": auto_vs_fixed(configs),
        "configs": configs,
    }, warnings
