"""The memory planner against the GPU: predicted peak (treeflash fit's plan) vs measured peak
(torch.cuda.max_memory_reserved + the CUDA context), and an emulated 24 GiB card.

Each configuration runs in a fresh process (a clean allocator and peak): it builds the stack the way
`treeflash generate` does (plan at start, then load), prefills a prompt of `context - decode` random
tokens and decodes `decode` tokens (speculating where a drafter is configured; random weights, so
acceptance is low: this measures memory, never speed). Within: |predicted - measured| <= max(3%, 256 MiB).

The emulated card: torch.cuda.set_per_process_memory_fraction caps the allocator at 24 GiB minus the
measured context; `--max-context auto --gpu-memory 24GiB` picks a context, one request uses all of
it (prompt + max_tokens = context) and must decode without running out of memory, and a context 5%
larger must be refused by the planner at start.

    python -m bench.fit_check --out $OUT/fit_check.json --workdir /tmp/fit_ckpt \\
        --gguf /models/Qwen3.6-27B-Q4_K_M.gguf      # the 27B rows (skipped without it)
    python -m bench.fit_check --toy --out /tmp/fit_toy.json   # CPU: toy shapes, the stack builds and decodes; predicted only

Random checkpoints are written under --workdir (bf16 8B: 16 GB, hybrid 9B: 18 GB) and reused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root: each configuration's process runs there

GiB, MiB = 1 << 30, 1 << 20
TOLERANCE = (0.03, 256 * MiB)

# name: (model: an SHAPES key or "gguf", drafter, K type, V type, context, decode steps)
CONFIGS = {
    "8b-bf16-32k": ("qwen3-8b", None, "auto", "auto", 32768, 256),
    "8b-bf16-32k-q8_0-dflash": ("qwen3-8b", "dflash", "q8_0", "q8_0", 32768, 256),
    "8b-bf16-64k-tq3_0": ("qwen3-8b", None, "tq3_0", "tq3_0", 65536, 256),
    "hybrid9b-bf16-32k-q4_0-dflash": ("hybrid-9b", "dflash", "q4_0", "q4_0", 32768, 256),
    "27b-q4km-32k-q8_0": ("gguf", None, "q8_0", "q8_0", 32768, 256),
    "27b-q4km-32k-tq3_0-dflash": ("gguf", "dflash", "q8_0", "tq3_0", 32768, 256),
    "27b-q4km-128k-q4_0": ("gguf", None, "q4_0", "q4_0", 131072, 256),
    "27b-q4km-128k-q8_0-tq3_0-dflash": ("gguf", "dflash", "q8_0", "tq3_0", 131072, 256),
    # issue #31's 24 GB card: the 27B Q4_K_M blocks, a DFlash drafter and a q4_0 cache at 128K under a 24 GiB cap,
    # 2,000 tokens decoded with speculation (random weights: memory and that it runs, never acceptance)
    "24gib-27b-q4km-128k-q4_0-dflash": ("gguf", "dflash", "q4_0", "q4_0", 131072, 2000),
}
CARD_24GIB = frozenset({"24gib-27b-q4km-128k-q4_0-dflash"})  # configurations run under an emulated 24 GiB card
# what a 24 GB card needs past the shared flags: the drafter's layers as Q8_0 blocks (1.84 instead of 3.46 GB) and
# DDTrees of 15 drafts (verify graphs up to 16 nodes: 0.13 instead of 1.02 GB with --budget auto's 128)
# and 512-token prefill chunks (the plan's 1024 leaves 65 MiB of 24 GiB; 512: 414 MiB)
EXTRA_FLAGS = {"24gib-27b-q4km-128k-q4_0-dflash": ("--drafter-weights", "q8_0", "--budget", "15", "--prefill-chunk", "512")}
TOY = {
    "toy-dense-bf16": ("toy-dense", None, "auto", "auto", 512, 16),
    "toy-dense-q8_0-dflash": ("toy-dense", "dflash", "q8_0", "q8_0", 512, 16),
    "toy-hybrid-tq3_0": ("toy-hybrid", None, "tq3_0", "tq3_0", 512, 16),
}
EMULATED = ("24gib-8b-bf16-auto", "qwen3-8b", "toy-dense")


def prepare(name: str, spec: tuple, args) -> tuple[str, str | None] | None:
    """(model path, drafter path) for a configuration, writing random checkpoints as needed (in a child
    process: the parent never holds GPU memory, which the measuring child would count as its context);
    None: skipped."""
    if args.toy or args.prepare:
        return _prepare(name, spec, args)
    proc = subprocess.run([sys.executable, "-m", "bench.fit_check", "--prepare", name, "--workdir", args.workdir]
                          + (["--gguf", args.gguf] if args.gguf else []) + (["--gguf-drafter", args.gguf_drafter] if args.gguf_drafter else []),
                          cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("[") or l == "null"]
    if proc.returncode or not lines:
        raise RuntimeError(f"preparing {name} failed: {(proc.stderr or proc.stdout)[-2000:]}")
    paths = json.loads(lines[-1])
    return None if paths is None else (paths[0], paths[1])


def _prepare(name: str, spec: tuple, args) -> tuple[str, str | None] | None:
    from bench.fit_synth import write_dflash, write_hf

    shape, draft = spec[0], spec[1]
    device = "cpu" if args.toy else "cuda"
    work = Path(args.workdir)
    if shape == "gguf":
        if not args.gguf:
            return None
        model = args.gguf
        drafter = args.gguf_drafter or (write_dflash_for_gguf(model, work / "dflash-gguf", device) if draft else None)
        return model, drafter
    model = str(write_hf(shape, work / shape, device))
    return model, (str(write_dflash(shape, work / f"dflash-{shape}", device=device)) if draft else None)


def write_dflash_for_gguf(gguf_path: str, out: Path, device: str) -> str:
    """A random DFlash drafter matched to a GGUF target's hidden size and layer count."""
    from bench import fit_synth

    from treeflash.models.memory import read_header

    c = read_header(gguf_path).config
    target = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
              "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size}
    return str(fit_synth.write_dflash(target, out, device=device))


def flags(model: str, drafter: str | None, k: str, v: str, context, device: str, gpu_memory: str) -> list[str]:
    f = ["generate", "--model", model, "--device", device, "--cache-type-k", k, "--cache-type-v", v,
         "--max-context", str(context), "--gpu-memory", gpu_memory, "--quiet"]
    if model.endswith(".gguf"):
        f += ["--weights", "native"]  # the GGUF's blocks kept as stored, as on a 24 GB card
    if drafter:
        f += ["--draft", "dflash", "--draft-model", drafter]
    return f


def run_one(job: dict) -> dict:
    """In the child process: build, prefill, decode; predicted vs measured."""
    import torch

    from treeflash.cli.common import build_engine
    from treeflash.cli.main import build_parser
    from treeflash.cli.planning import PlanError, plan_at_start
    from treeflash.engine.request import GenerationRequest

    cuda = job["device"] == "cuda"
    context_bytes = None
    if cuda:
        torch.cuda.init()
        torch.ones(1, device="cuda") @ torch.ones(1, 1, device="cuda")  # the context and cuBLAS handle, as the first GEMM makes them
        free, total = torch.cuda.mem_get_info()
        context_bytes = total - free  # a dedicated GPU: what this process's context holds
        if job.get("emulate_bytes"):
            torch.cuda.set_per_process_memory_fraction((job["emulate_bytes"] - context_bytes) / total)
    argv = list(job["flags"])
    if cuda and argv[argv.index("--gpu-memory") + 1] == "auto":
        argv[argv.index("--gpu-memory") + 1] = str(total)  # the whole card: the plan then counts the context, as measured
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    start = plan_at_start(args)
    args.start_plan = start
    out = {"max_context": start.max_context, "predicted_bytes": start.plan.total,
           "predicted_parts": {p.name: p.bytes for p in start.plan.parts}}
    engine = build_engine(args, progress=False)
    if cuda:
        out["after_build"] = {"allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
                              "max_reserved_bytes": torch.cuda.max_memory_reserved()}
    decode = job["decode"]
    prompt_len = start.max_context - decode
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, engine.model.config.vocab_size - 2, (prompt_len,), generator=g).tolist()
    oom = None
    try:
        _, tokens, last = engine.complete(GenerationRequest(tuple(ids), max_tokens=decode, ignore_eos=True))
        out.update(decoded_tokens=len(tokens), tau=(last.usage.spec or {}).get("tau"))
    except torch.OutOfMemoryError as e:
        oom = str(e).splitlines()[0]
    out.update(oom=oom, seconds=round(time.perf_counter() - t0, 1))
    if cuda:
        reserved = torch.cuda.max_memory_reserved()
        measured = reserved + context_bytes
        tol = max(TOLERANCE[0] * measured, TOLERANCE[1])
        out.update(measured_bytes=measured, max_reserved_bytes=reserved, max_allocated_bytes=torch.cuda.max_memory_allocated(),
                   context_bytes=context_bytes, error_bytes=start.plan.total - measured,
                   within=abs(start.plan.total - measured) <= tol)
        if job.get("emulate_bytes"):
            out["under_emulated_card"] = measured <= job["emulate_bytes"]
    if job.get("refuse_factor"):  # the same flags asking for a larger context: the planner must refuse at start
        more = list(argv)
        more[more.index("--max-context") + 1] = str(int(start.max_context * job["refuse_factor"]))
        out["refused_context"] = int(more[more.index("--max-context") + 1])
        try:
            plan_at_start(build_parser().parse_args(more))
            out["five_percent_more_refused"] = False
        except PlanError:
            out["five_percent_more_refused"] = True
    return out


def child(job: dict, timeout: int) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.fit_check", "--child", json.dumps(job)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"error": f"timed out after {timeout} s; stderr: {err[-1500:]}"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "returncode": proc.returncode}
    return json.loads(lines[-1])


def write(path: str, rows: dict, device: str) -> dict:
    """The JSON so far (written after every configuration, so a cut-off run keeps its rows)."""
    measured = [r for r in rows.values() if "within" in r]
    doc = {"fit_check": 1, "command": " ".join(sys.argv), "device": device, "tolerance": {"fraction": TOLERANCE[0], "bytes": TOLERANCE[1]},
           "configurations": rows, "all_within": all(r["within"] for r in measured) if measured else None,
           "measured_count": len(measured)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="the JSON to write")
    p.add_argument("--workdir", default="/tmp/treeflash_fit_check", help="where random checkpoints are written (reused)")
    p.add_argument("--gguf", default=None, help="a Qwen3.6-27B Q4_K_M GGUF (real or random weights) for the 27B rows")
    p.add_argument("--gguf-drafter", default=None, help="a DFlash drafter for the GGUF (default: a random one matched to it)")
    p.add_argument("--only", default=None, help="comma-separated configuration names (default: all)")
    p.add_argument("--toy", action="store_true", help="CPU: toy shapes; the stack builds and decodes, predicted only")
    p.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_one(json.loads(args.child))))
        return 0
    if args.prepare:
        if args.prepare == EMULATED[0]:
            from bench.fit_synth import write_hf
            print(json.dumps([str(write_hf(EMULATED[1], Path(args.workdir) / EMULATED[1], "cuda")), None]))
        else:
            print(json.dumps(_prepare(args.prepare, CONFIGS[args.prepare], args)))
        return 0
    if not args.out:
        p.error("--out is required")
    device = "cpu" if args.toy else "cuda"
    configs = TOY if args.toy else CONFIGS
    wanted = set(args.only.split(",")) if args.only else None
    rows = {}
    for name, spec in configs.items():
        if wanted and name not in wanted:
            continue
        paths = prepare(name, spec, args)
        if paths is None:
            rows[name] = {"skipped": "pass --gguf"}
            continue
        _, _, k, v, context, decode = spec
        card = name in CARD_24GIB and not args.toy
        gpu = "200GiB" if args.toy else "24GiB" if card else "auto"
        job = {"flags": flags(*paths, k, v, context, device, gpu) + list(EXTRA_FLAGS.get(name, ())), "device": device, "decode": decode}
        if card:
            job["emulate_bytes"] = 24 * GiB
        rows[name] = child(job, args.timeout)
        print(f"[fit_check] {name}: {json.dumps(rows[name])[:400]}", file=sys.stderr, flush=True)
        write(args.out, rows, device)
    name, shape, toy_shape = EMULATED
    if not wanted or name in wanted:
        if args.toy:
            from bench.fit_synth import write_hf
            model = str(write_hf(toy_shape, Path(args.workdir) / toy_shape, device))
        else:
            model = prepare(name, None, args)[0]
        card = "8MiB" if args.toy else "24GiB"  # toy: small enough that the memory, not the model, limits the context
        job = {"flags": flags(model, None, "auto", "auto", "auto", device, card), "device": device, "decode": 16 if args.toy else 256,
               "emulate_bytes": None if args.toy else 24 * GiB, "refuse_factor": 1.05}
        first = rows[name] = child(job, args.timeout)
        print(f"[fit_check] {name}: {json.dumps(first)[:400]}", file=sys.stderr, flush=True)
    doc = write(args.out, rows, device)
    print(f"[fit_check] wrote {args.out}: {doc['measured_count']} measured, all within: {doc['all_within']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
