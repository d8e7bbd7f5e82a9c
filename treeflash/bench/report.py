"""The benchmark's outputs: a terminal table, the JSON artifact, a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path


def _pm(s: dict | None, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
    if not s or s.get("mean") is None:
        return "-"
    m, lo, hi = s["mean"] * scale, s["min"] * scale, s["max"] * scale
    return f"{fmt.format(m)} [{fmt.format(lo)}-{fmt.format(hi)}]" if s["n"] > 1 else fmt.format(m)


def format_table(summary: dict, warnings: list[dict] | None = None) -> str:
    """One row per target: mean [min-max] over passes."""
    head = ["target", "decode tok/s", "e2e tok/s", "decode tok/cpu-s", "TTFT ms", "tau", "budget", "accept d1/d2/d3/d4", "draft/verify/rest",
            "speedup", "cpu speedup", "same"]
    rows = [head]
    for c in summary["configs"]:
        acc = c.get("acceptance_per_depth")
        split = c.get("time_split")
        same = c.get("outputs_vs_baseline")
        rows.append([
            c["label"],
            _pm(c["tokens_per_second"]),
            _pm(c["e2e_tokens_per_second"]),
            _pm(c.get("tokens_per_cpu_second")),
            _pm(c["ttft_s"], "{:.0f}", 1000.0),
            _pm(c.get("tau"), "{:.2f}"),
            f"{c['budget']['mean']:.1f}" if c.get("budget") else "-",  # mean draft nodes per step
            "/".join(f"{a:.2f}" for a in acc[:4]) if acc else "-",
            "/".join(f"{100 * split[p]:.0f}%" for p in ("draft", "verify", "rest")) if split else "-",
            _pm(c.get("speedup_vs_baseline"), "{:.2f}x"),
            _pm(c.get("cpu_speedup_vs_baseline"), "{:.2f}x"),
            "-" if not same else ("yes" if same["identical"] else f"NO ({len(same['mismatches'])})"),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for w in warnings or []:
        cpu = f"; per CPU-second: {-100 * w['cpu_time_drop']:+.0f}%" if "cpu_time_drop" in w else ""
        lines.append(f"WARNING: {w['target']} on {w['prompt']} run {w['run'] + 1}: {w['metric']} {w['value']:.3g} is "
                     f"{100 * w['drop']:.0f}% below the first run's {w['first']:.3g}{cpu} (possible silent collapse)")
    avf = summary.get("auto_vs_best_fixed")
    if avf:
        lines.append(f"auto vs the best fixed budget ({avf['best_fixed']}): {avf['tokens_per_second_ratio']:.3f}x decode tokens/s")
    return "\n".join(lines)


def write_json(path: str | Path, doc: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def plot(path: str | Path, summary: dict, sweep_key: str | None = None, title: str = "") -> None:
    """A sweep: tokens/s and tau against the swept value. Otherwise: tokens/s per target, tau on the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = summary["configs"]
    base = next((c for c in configs if c["label"] == summary.get("baseline")), None)
    spec = [c for c in configs if c is not base]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    if sweep_key is not None and all(isinstance(c.get("sweep_value"), int) for c in spec):  # ('auto' among them: bars)
        xs = [c["sweep_value"] for c in spec]
        ys = [c["tokens_per_second"]["mean"] for c in spec]
        err = [[y - c["tokens_per_second"]["min"] for y, c in zip(ys, spec)],
               [c["tokens_per_second"]["max"] - y for y, c in zip(ys, spec)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color="tab:blue", label="decode tokens/s")
        if base is not None:
            ax.axhline(base["tokens_per_second"]["mean"], color="gray", ls="--", label=f"{base['label']} tokens/s")
        ax.set_xlabel(sweep_key)
        ax.set_xticks(xs)
        ax.set_ylabel("decode tokens/s (min-max over runs)")
        taus = [(c["sweep_value"], c["tau"]["mean"]) for c in spec if c.get("tau")]
        if taus:
            ax2 = ax.twinx()
            ax2.plot([t[0] for t in taus], [t[1] for t in taus], marker="s", color="tab:orange", label="tau")
            ax2.set_ylabel("tau (tokens per target pass)")
            ax2.set_ylim(0, 1.15 * max(t[1] for t in taus))
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=8)
        else:
            ax.legend(loc="lower right", fontsize=8)
    else:
        labels = [c["label"] for c in configs]
        ys = [c["tokens_per_second"]["mean"] for c in configs]
        err = [[y - c["tokens_per_second"]["min"] for y, c in zip(ys, configs)],
               [c["tokens_per_second"]["max"] - y for y, c in zip(ys, configs)]]
        colors = ["tab:gray" if c is base else "tab:blue" for c in configs]
        bars = ax.bar(range(len(labels)), ys, yerr=err, capsize=4, color=colors)
        for b, c in zip(bars, configs):
            note = f"tau {c['tau']['mean']:.2f}" if c.get("tau") else ""
            if "speedup_vs_baseline" in c:
                note += f"\n{c['speedup_vs_baseline']['mean']:.2f}x"
            if note:
                top = c["tokens_per_second"]["max"]  # above the error bar
                ax.annotate(note.strip(), (b.get_x() + b.get_width() / 2, top), ha="center", va="bottom",
                            fontsize=8, xytext=(0, 3), textcoords="offset points")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("decode tokens/s (min-max over runs)")
    top = max((c["tokens_per_second"]["max"] or 0.0) for c in configs)
    ax.set_ylim(0, 1.25 * top if top > 0 else 1.0)  # room above the bars for the tau / speedup notes
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
