"""Where a speculative step's time goes on the GPU: host wall against GPU busy, phase by phase.

    python bench/spec_step_profile.py --target /tmp/smol.gguf --drafter treeflash/assets/smollm2_dflash \
        --configs plain chain ddtree-22 --max-tokens 256 --out $OUT/spec_profile.json

On the first held-out prompts, greedy, the decoders of `treeflash.train.evaluate` (CUDA graphs for
the target and the drafter). Each configuration decodes once to warm up, then once under
torch.profiler with the decoder's phases labelled (draft = drafter.propose, forward = the verify
pass, walk = the acceptance walk, commit, observe). The report per configuration:

- wall per pass (host clock) and GPU kernel time per pass (CUPTI: the kernels inside graph replays
  included). CUPTI's per-kernel tracing inflates short kernels inside graphs (on the H200 the
  SmolLM2 decode graph's kernels summed to ~3x its 0.58 ms replay), so read the kernel times
  as shares, not as absolute figures;
- per phase: host time (the labelled region's CPU total) and the kernel time launched inside it;
- the CPU ops with the most self time (what the host spends its time on).

A step whose GPU time is far below its wall is host-bound: fewer host ops per step moves it; a
faster kernel does not.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

PHASES = ("tf.draft", "tf.forward", "tf.walk", "tf.commit", "tf.observe")


def _label(obj, name: str, label: str) -> None:
    """Wrap obj.name in a profiler range called `label` (instance attribute: the class is untouched)."""
    fn = getattr(obj, name)

    def wrapped(*a, **k):
        with torch.profiler.record_function(label):
            return fn(*a, **k)

    setattr(obj, name, wrapped)


def _label_walk():
    import treeflash.spec.decoder as decoder_mod

    plain = decoder_mod.verify

    def verify(*a, **k):
        with torch.profiler.record_function("tf.walk"):
            return plain(*a, **k)

    decoder_mod.verify = verify


def profile_config(model, cfg, ids, max_tokens, eos, top_ops: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from treeflash.train.evaluate import decode

    decode(model, cfg, ids, max_tokens, eos)  # warm-up: same prompt, same lengths
    if cfg.runner is not None:
        _label(cfg.runner, "forward", "tf.forward")
        _label(cfg.runner, "commit", "tf.commit")
    if cfg.drafter is not None:
        _label(cfg.drafter, "propose", "tf.draft")
        _label(cfg.drafter, "observe", "tf.observe")
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t0 = time.perf_counter()
        toks, _pre_s, dec_s, stats = decode(model, cfg, ids, max_tokens, eos)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    passes = max(stats.passes, 1) if cfg.drafter is not None else max(len(toks) - 1, 1)
    events = prof.events()
    cpu, gpu = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    # kernels only: the phase labels also appear on the GPU timeline (annotations spanning their kernels)
    kernel_us = sum(e.device_time for e in events if e.device_type == gpu and e.name not in PHASES)
    ranges = {p: [(e.time_range.start, e.time_range.end) for e in events if e.name == p and e.device_type == cpu] for p in PHASES}
    phase = {}
    for p, rs in ranges.items():
        if not rs:
            continue
        host_us = sum(b - a for a, b in rs)
        phase[p] = {"calls": len(rs), "host_ms_per_pass": round(host_us / 1e3 / passes, 4)}
    avg = prof.key_averages()
    cpu_top = sorted(avg, key=lambda e: e.self_cpu_time_total, reverse=True)[:top_ops]
    gpu_top = sorted((e for e in avg if e.key not in PHASES), key=lambda e: getattr(e, "self_device_time_total", 0.0),
                     reverse=True)[:top_ops]
    return {
        "tokens": len(toks),
        "passes": passes,
        "tau": round(stats.tau, 3) if cfg.drafter is not None else None,
        "decode_s": round(dec_s, 4),
        "wall_ms_per_pass": round(dec_s * 1e3 / passes, 4),  # the decode loop alone (the prefill excluded)
        "wall_with_prefill_s": round(wall, 4),
        "gpu_kernel_ms_per_pass": round(kernel_us / 1e3 / passes, 4),  # the prompt's prefill kernels included
        "phases": phase,
        "cpu_self_top": [{"op": e.key, "calls_per_pass": round(e.count / passes, 2),
                          "self_cpu_ms_per_pass": round(e.self_cpu_time_total / 1e3 / passes, 4)} for e in cpu_top],
        "gpu_self_top": [{"op": e.key[:90], "calls_per_pass": round(e.count / passes, 2),
                          "gpu_ms_per_pass": round(getattr(e, "self_device_time_total", 0.0) / 1e3 / passes, 4)}
                         for e in gpu_top],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="the target (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default="treeflash/assets/smollm2_dflash")
    p.add_argument("--configs", nargs="+", default=["plain", "chain", "ddtree-22"],
                   help="plain, chain, ddtree-N (N: the DDTree node budget)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt", type=int, default=0, help="which held-out prompt (0-19)")
    p.add_argument("--top-ops", type=int, default=25)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: eager, host ops only (a smoke run)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available (--device cpu profiles the eager path's host ops only)")

    from treeflash.data.prompts import encode_prompt
    from treeflash.models.loader import load_model
    from treeflash.train.evaluate import build_configs
    from treeflash.train.prompts import heldout_prompts

    loaded = load_model(args.target, device=args.device, progress=False)
    if args.device == "cuda":
        loaded.model.fuse_projections()
    prompt = heldout_prompts()[args.prompt]
    ids = encode_prompt(loaded, prompt)
    eos = set(loaded.config.eos_token_ids) | ({loaded.tokenizer.eos_token_id} if loaded.tokenizer.eos_token_id is not None else set())
    budgets = sorted({int(c.split("-")[1]) for c in args.configs if c.startswith("ddtree-")})
    _label_walk()
    report = {"target": loaded.source, "drafter": args.drafter, "prompt": prompt.name, "max_tokens": args.max_tokens,
              "configs": {}}
    with torch.inference_mode():
        configs = build_configs(loaded, args.drafter, budgets, args.device == "cuda", len(ids) + args.max_tokens + 80)
        for cfg in configs:
            if cfg.name not in args.configs:
                continue
            report["configs"][cfg.name] = row = profile_config(loaded.model, cfg, ids, args.max_tokens, eos, args.top_ops)
            print(f"[profile] {cfg.name}: wall {row['wall_ms_per_pass']} ms/pass, GPU kernels {row['gpu_kernel_ms_per_pass']} "
                  f"ms/pass, tau {row['tau']}, phases " + " ".join(f"{k}={v['host_ms_per_pass']}" for k, v in row["phases"].items()),
                  flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
