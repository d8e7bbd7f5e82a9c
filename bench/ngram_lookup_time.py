"""Time the n-gram drafter's lookup per decode step at long contexts (CPU; no model).

    python -m bench.ngram_lookup_time --contexts 1024 32768 131072 --out ngram_lookup.json

The context is random tokens from a 32K vocabulary in which 30% of the spans copy an earlier span
(what prompt lookup feeds on). Each step commits 1-5 tokens and asks for
a 16-token draft; the scan (`lookup`, the definition) is timed on the same steps for comparison.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from treeflash.spec.ngram import NgramIndex, lookup


def context_tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n:  # random runs with copies of earlier spans (what prompt lookup feeds on)
        if out and rng.random() < 0.3:
            s = rng.randrange(len(out))
            out.extend(out[s : s + rng.randint(4, 64)])
        else:
            out.extend(rng.randrange(32000) for _ in range(rng.randint(4, 64)))
    return out[:n]


def time_steps(tokens: list[int], steps: int, draft: int, seed: int, scan: bool) -> list[float]:
    rng = random.Random(seed)
    committed = tokens[: len(tokens) - steps * 5]
    index = NgramIndex(4, 1)
    index.update(committed)  # the prompt: indexed once, like a prefill
    times = []
    pos = len(committed)
    for _ in range(steps):
        root = tokens[pos]
        t0 = time.perf_counter()
        if scan:
            lookup(committed + [root], 4, 1, draft)
        else:
            index.lookup(committed, root, draft)
        times.append(time.perf_counter() - t0)
        n = rng.randint(1, 5)
        committed.extend(tokens[pos : pos + n])
        pos += n
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 32768, 131072])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--scan-steps", type=int, default=20, help="steps timed with the O(context) scan (slow)")
    ap.add_argument("--draft", type=int, default=16)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    for n in args.contexts:
        toks = context_tokens(n + args.steps * 5, seed=n)
        t0 = time.perf_counter()
        NgramIndex(4, 1).update(toks[:n])
        build = time.perf_counter() - t0
        inc = time_steps(toks, args.steps, args.draft, 1, scan=False)
        sc = time_steps(toks, args.scan_steps, args.draft, 1, scan=True)
        row = {"context": n, "index_build_s": build, "step_median_ms": statistics.median(inc) * 1e3,
               "step_max_ms": max(inc) * 1e3, "scan_median_ms": statistics.median(sc) * 1e3}
        rows.append(row)
        print(f"context {n:>7}: index {row['step_median_ms']:.4f} ms/step (max {row['step_max_ms']:.3f}), "
              f"scan {row['scan_median_ms']:.2f} ms/step, prompt indexed in {build:.2f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"tool": "ngram_lookup_time", "draft": args.draft, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
