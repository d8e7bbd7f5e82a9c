"""treeflash bench: tokens/s, time to first token, tau, acceptance per depth and the time split,
over several passes, side by side with the autoregressive baseline, as a table, a JSON and a plot."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from treeflash.cli.common import add_model_args, parse_bandit, parse_budget
from treeflash.errors import InvalidRequestError

EXAMPLES = """examples:
  treeflash bench --prompts humaneval --num-prompts 10 --draft ngram --baseline ar --json out.json
  treeflash bench --model ./Qwen3.6-27B --draft dflash --draft-model ./drafter \\
      --sweep budget=6,10,14,18,22,26,30 --baseline ar --json sweep.json --plot sweep.png
  treeflash bench --draft dflash --sweep budget=auto,4,8,16,32,64 --baseline ar --temperature 0.8 --json auto.json
  treeflash bench --draft dflash --auto-arms 0,8,32 --baseline ar --prompts humaneval --num-prompts 10
  treeflash bench --endpoint http://localhost:8000 --prompts chat --runs 3
  treeflash bench --rerun sweep.json --json again.json
"""

OUTPUT_ARGS = ("json", "plot", "rerun", "quiet", "api_key", "func", "command")  # never stored, never rerun


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure tokens/s, tau and speedup (in-process or against an endpoint)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="spaceinvaders",
                   help="spaceinvaders (default), humaneval, chat, or a .txt (one prompt per line) / .jsonl file")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts of the set (default: all)")
    p.add_argument("--runs", type=int, default=3, help="passes over the prompt set (default 3)")
    p.add_argument("--max-tokens", type=int, default=2000, help="most tokens per request (default 2000)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default; outputs are checked for identity)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed when --temperature > 0 (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded short requests per target first (default 1)")
    p.add_argument("--baseline", default=None, metavar="ar|URL",
                   help="ar: also run the target without a drafter, interleaved, and report the speedup; "
                        "a URL: an OpenAI-compatible server as the baseline")
    p.add_argument("--sweep", default=None, metavar="KEY=V1,V2,...",
                   help="one run per value of a drafter option: budget, num_draft, ngram_max, ngram_min")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write every run, the configuration and a summary")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="plot tokens/s (and tau) per target or sweep value")
    p.add_argument("--rerun", default=None, metavar="IN.json", help="repeat the measurement described by a bench JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    e = p.add_argument_group("endpoint (measure a running OpenAI-compatible server instead)")
    e.add_argument("--endpoint", default=None, metavar="URL", help="e.g. http://localhost:8000 (ours, llama.cpp, vLLM)")
    e.add_argument("--api-key", default=None, help="sent as a Bearer token")
    e.add_argument("--served-model", default=None, help="the model name to request (default: the first of /v1/models)")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from treeflash.bench import machine
    from treeflash.data.prompts import BenchPrompt, load_prompts
    from treeflash.bench.report import format_table, plot, write_json
    from treeflash.bench.runner import BenchSettings, run_schedule
    from treeflash.bench.summary import summarize

    started = time.time()
    prompts = None
    if args.rerun:
        doc = json.loads(Path(args.rerun).read_text(encoding="utf-8"))
        for k, v in doc["config"]["args"].items():
            if k not in OUTPUT_ARGS:
                setattr(args, k, v)
        prompts = [BenchPrompt(p["name"], tuple(p["messages"]) if "messages" in p else None, p.get("text"))
                   for p in doc["prompts"]]
        print(f"[bench] rerunning: {doc.get('command', '?')}", file=sys.stderr)
    _validate(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if prompts is None:
        prompts = load_prompts(args.prompts, args.num_prompts)
    settings = BenchSettings(args.max_tokens, args.temperature, args.seed, args.ignore_eos, args.runs, args.warmup)

    info: dict = {}
    if args.endpoint:
        targets, baseline, sweep_values = _endpoint_targets(args)
    else:
        targets, baseline, sweep_values, info = _engine_targets(args, prompts)
    print(f"[bench] {len(prompts)} prompt(s) x {args.runs} run(s) x {len(targets)} target(s): "
          f"{', '.join(t.label for t in targets)}", file=sys.stderr)
    records = run_schedule(targets, prompts, settings, progress=not args.quiet)
    if "memory" in info:
        from treeflash.cli.bench_memory import measured

        info["memory"] = measured(info["memory"], targets[-1].engine.model.device.type)
    summary, warnings = summarize(records, [t.label for t in targets], baseline, sweep_values, greedy=args.temperature == 0)
    print(format_table(summary, warnings))
    if baseline is not None and summary["speedup_vs_baseline"] is not None:
        same = {True: "token-identical", False: "NOT token-identical", None: "not compared"}[summary["outputs_identical"]]
        print(f"best: {summary['best']}: {summary['tokens_per_second']:.1f} tokens/s, "
              f"{summary['speedup_vs_baseline']:.2f}x vs {baseline}; outputs {same}")

    doc = {
        "treeflash_bench": 1,
        "command": command_line(args),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": round(time.time() - started, 1),
        "config": {"args": {k: v for k, v in vars(args).items() if k not in OUTPUT_ARGS},
                   "settings": asdict(settings),
                   "targets": [t.describe() for t in targets]},
        "versions": machine.versions(),
        "machine": machine.machine(),
        **info,
        "prompts": [p.as_dict() for p in prompts],
        "summary": summary,
        "oracle": _oracle_note(targets),
        "collapse_warnings": warnings,
        "runs": [r.as_dict() for r in records],
    }
    if args.json:
        write_json(args.json, doc)
        print(f"[bench] wrote {args.json}", file=sys.stderr)
    if args.plot:
        where = doc["machine"]["gpu"] or f"{doc['machine']['cpu']} ({doc['machine']['cpu_cores']} cores)"
        model = Path(info["model"]["source"]).name if info else args.endpoint
        title = f"{model} on {where}\n{Path(args.prompts).name} x{len(prompts)}, {args.runs} runs, " \
                f"max_tokens {args.max_tokens}, T={args.temperature}"
        plot(args.plot, summary, args.sweep.split("=")[0] if args.sweep else None, title)
        print(f"[bench] wrote {args.plot}", file=sys.stderr)
    return 0


def _oracle_note(targets) -> str | None:
    """The note of an oracle drafter among the targets (--draft replay), printed and kept in the JSON."""
    for t in targets:
        info = t.describe().get("drafter") or {}
        if info.get("oracle"):
            print(f"[bench] ORACLE: {info['note']}; its first pass of each prompt records (plain decoding)", file=sys.stderr)
            return info["note"]
    return None


def command_line(args: argparse.Namespace) -> str:
    """The command that repeats this measurement (every option spelled out, outputs left out)."""
    words = ["treeflash", "bench"]
    for k, v in vars(args).items():
        if k in OUTPUT_ARGS or v is None or v is False:
            continue
        words.append("--" + k.replace("_", "-"))
        if v is not True:
            words.append(str(v))
    return " ".join(shlex.quote(w) for w in words)


def _validate(args: argparse.Namespace) -> None:
    for name in ("runs", "max_tokens"):
        if getattr(args, name) < 1:
            raise InvalidRequestError(f"--{name.replace('_', '-')} must be >= 1", name)
    if args.threads is not None and args.threads < 1:
        raise InvalidRequestError("--threads must be >= 1", "threads")
    if args.warmup < 0:
        raise InvalidRequestError("--warmup must be >= 0", "warmup")
    b = args.baseline
    if b is not None and b != "ar" and not b.startswith(("http://", "https://")):
        raise InvalidRequestError(f"--baseline must be 'ar' or an http(s) URL, got {b!r}", "baseline")
    if args.endpoint and (args.sweep or b == "ar"):
        raise InvalidRequestError("--endpoint measures a remote server: --sweep and --baseline ar need an in-process model; "
                                  "use --baseline URL to compare with another server", "endpoint")
    if not args.endpoint and (args.sweep or b == "ar") and not args.draft:
        raise InvalidRequestError("--sweep and --baseline ar compare speculative decoding: add --draft (e.g. --draft ngram)", "draft")


def _endpoint_targets(args):
    from treeflash.bench.endpoint import EndpointTarget

    targets = [EndpointTarget(args.endpoint, args.api_key, args.served_model, label="endpoint")]
    if args.baseline:
        targets.insert(0, EndpointTarget(args.baseline, args.api_key, None, label="baseline"))
    return targets, ("baseline" if args.baseline else None), None


def load(args: argparse.Namespace):
    """The loaded target (tests replace this with a toy model)."""
    import torch

    from treeflash.cli.planning import resolved_weights
    from treeflash.models.loader import load_model

    return load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None,
                      progress=not args.quiet, weights=resolved_weights(args))


def _engine_targets(args, prompts):
    """Load the model once; build one Engine per configuration over it (baseline first)."""
    from treeflash.bench import machine
    from treeflash.bench.endpoint import EndpointTarget
    from treeflash.cli.bench_memory import planned
    from treeflash.bench.runner import EngineTarget
    from treeflash.data.prompts import encode_prompt
    from treeflash.bench.sweep import engine_configs, parse_sweep
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.spec.drafter import DraftOptions

    sweep = parse_sweep(args.sweep) if args.sweep else None
    loaded = load(args)
    longest = max(len(encode_prompt(loaded, p)) for p in prompts)
    # only the KV the longest request needs (+ room for the last verify tree), so a sweep's engines fit together
    requested = args.max_context if isinstance(args.max_context, int) else loaded.config.max_position_embeddings
    max_context = min(requested, longest + args.max_tokens + 256)
    options = DraftOptions(num_draft=args.num_draft, draft_model=args.draft_model, budget=parse_budget(args.budget),
                           tree=not args.no_tree, mtp_tree=args.mtp_tree,
                           replay_corrupt=getattr(args, "replay_corrupt", 0.0), bandit=parse_bandit(args.auto_arms),
                           drafter_weights=getattr(args, "drafter_weights", "float"))
    base = EngineConfig(max_context=max_context, draft=args.draft, draft_options=options,
                        cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
                        cache_k_exact_layers=args.cache_k_exact_layers)
    targets, sweep_values = [], {}
    if args.draft:
        for label, value, config in engine_configs(base, sweep):
            targets.append(EngineTarget(Engine(loaded, config), label, value))
            if value is not None:
                sweep_values[label] = value
    baseline = None
    if args.baseline == "ar" or not args.draft:
        baseline = "ar" if args.draft else None
        targets.insert(0, EngineTarget(Engine(loaded, EngineConfig(max_context=max_context, cache_type_k=args.cache_type_k,
                                                                  cache_type_v=args.cache_type_v,
                                                                  cache_k_exact_layers=args.cache_k_exact_layers)), "ar"))
    elif args.baseline:  # a server (ours or a peer) side by side with the in-process engine
        targets.insert(0, EndpointTarget(args.baseline, args.api_key, None, label="endpoint"))
        baseline = "endpoint"
    model = {"source": loaded.source, "arch": loaded.config.arch, "longest_prompt_tokens": longest,
             "max_context": targets[-1].engine.max_context, **machine.roofline(loaded.model)}
    engines = sum(isinstance(t, EngineTarget) for t in targets)
    memory = planned(args, targets[-1].engine.max_context, loaded.model.device.type, engines, getattr(loaded.model, "weights_format", "float"))
    return targets, baseline, sweep_values or None, {"model": model, "memory": memory}
