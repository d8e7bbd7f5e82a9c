"""Decode speed of the embedded default (SmolLM2-135M-Instruct) on this CPU: treeflash against
transformers' generate on the same GGUF, same prompts, interleaved in one run.

    python -m bench.cpu_decode --threads 1 --out bench/results/cpu_decode.json

Three rows per prompt: treeflash fp32 (the GGUF dequantized, as transformers loads it),
treeflash `--weights int4` (the GGUF's Q4_1 layers kept at 4 bits, bf16-level precision), and
transformers fp32. Decode tokens/s = (tokens - 1) / (time after the first token), by the wall
clock and per CPU-second of this process (steadier on a shared machine); greedy, EOS ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


from treeflash.engine.chat import render_chat
from treeflash.models.default_model import default_model_path
from treeflash.models.loader import load_model
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
]


@torch.inference_mode()
def ours_decode(loaded, ids: list[int], n: int) -> tuple[list[int], float, float]:
    model = loaded.model
    cache = model.new_cache(len(ids) + n + 8)
    dec = Decoder(model, cache, SamplingParams())
    out = [dec.prefill(ids)]
    t0, c0 = time.perf_counter(), time.process_time()
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], (n - 1) / (time.perf_counter() - t0), (n - 1) / (time.process_time() - c0)


@torch.inference_mode()
def hf_decode(hf, ids: list[int], n: int) -> tuple[list[int], float]:
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):  # stamps the time when the first token's logits are processed
        def __init__(self):
            self.first = None

        def __call__(self, input_ids, scores):
            if self.first is None:
                self.first, self.first_cpu = time.perf_counter(), time.process_time()
            return scores

    clock = Clock()
    x = torch.tensor([ids])
    out = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, logits_processor=LogitsProcessorList([clock]))
    end, end_cpu = time.perf_counter(), time.process_time()
    return out[0, len(ids):].tolist(), (n - 1) / (end - clock.first), (n - 1) / (end_cpu - clock.first_cpu)


def gemv_rates(n: int = 49152, k: int = 576, iters: int = 30) -> dict:
    """One token's head GEMV (SmolLM2: 49152 x 576) in fp32, bf16 and int4: ms and GB/s of weights read."""
    from treeflash.models.int4_linear import Int4Linear, int4_kernel_available

    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(1, k, generator=g)
    cases = {"fp32": (lambda: torch.nn.functional.linear(x, w), n * k * 4),
             "bf16": (lambda xb=x.bfloat16(), wb=w.bfloat16(): torch.nn.functional.linear(xb, wb), n * k * 2)}
    if int4_kernel_available():
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
        lin = Int4Linear(q, torch.rand(n, k // 32, generator=g) * 0.01, torch.zeros(n, k // 32))
        cases["int4"] = (lambda: lin(x), n * k // 2 + n * (k // 32) * 4)
    out = {}
    for name, (fn, nbytes) in cases.items():
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = (time.perf_counter() - t0) / iters
        out[name] = {"ms": round(dt * 1e3, 3), "weight_gb_s": round(nbytes / dt / 1e9, 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    p.add_argument("--out", default="bench/results/cpu_decode.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    loaded = load_model(None, device="cpu", dtype=torch.float32, progress=False)
    loaded.model.fuse_projections()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    gemv = gemv_rates()
    print(f"head GEMV 49152x576: {gemv}", flush=True)
    int4 = load_model(None, device="cpu", dtype=torch.float32, progress=False, weights="int4")
    rows = []
    for r in range(args.rounds):
        for prompt in PROMPTS:
            text = render_chat(loaded.chat_template, [{"role": "user", "content": prompt}])
            ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
            order = ("fp32", "int4", "hf") if r % 2 == 0 else ("hf", "int4", "fp32")
            got = {}
            for who in order:
                got[who] = hf_decode(hf, ids, args.tokens) if who == "hf" else ours_decode(loaded if who == "fp32" else int4, ids, args.tokens)
            (a_ids, a, a_cpu), (q_ids, q, q_cpu), (b_ids, b, b_cpu) = got["fp32"], got["int4"], got["hf"]
            # transformers' min_new_tokens masks EOS, so compare the tokens before our first EOS
            eos = set(loaded.config.eos_token_ids)
            cut = next((i for i, t in enumerate(a_ids) if t in eos), len(a_ids))
            same = a_ids[:cut] == b_ids[:cut]
            int4_same = next((i for i in range(cut) if q_ids[i] != a_ids[i]), cut)
            rows.append({"round": r, "prompt": prompt, "treeflash_tok_s": a, "treeflash_int4_tok_s": q, "transformers_tok_s": b,
                         "treeflash_tok_per_cpu_s": a_cpu, "treeflash_int4_tok_per_cpu_s": q_cpu, "transformers_tok_per_cpu_s": b_cpu,
                         "same_tokens_until_eos": same, "compared_tokens": cut, "int4_same_as_fp32_for_first": int4_same})
            print(f"round {r} {prompt[:30]!r}: treeflash fp32 {a:.1f} tok/s ({a_cpu:.1f}/cpu-s), int4 {q:.1f} ({q_cpu:.1f}), "
                  f"transformers {b:.1f} ({b_cpu:.1f}); fp32 same tokens {same} ({cut}); int4 = fp32 for {int4_same}", flush=True)
    med = {k: statistics.median(x[k] for x in rows) for k in rows[0] if k.endswith("_s") and k != "compared_tokens"}
    ours, theirs, q4 = med["treeflash_tok_s"], med["transformers_tok_s"], med["treeflash_int4_tok_s"]
    result = {
        "command": "python -m bench.cpu_decode " + " ".join(sys.argv[1:]),
        "load_average_1min_at_end": os.getloadavg()[0],
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "torch": torch.__version__, "model": str(path.name), "dtype": "float32", "tokens": args.tokens,
        "head_gemv": gemv, "rows": rows, "medians": med, "median_treeflash_tok_s": ours, "median_transformers_tok_s": theirs, "ratio": ours / theirs,
        "median_treeflash_int4_tok_s": q4, "ratio_int4": q4 / theirs,
        "ratio_per_cpu_s": med["treeflash_tok_per_cpu_s"] / med["transformers_tok_per_cpu_s"],
        "ratio_int4_per_cpu_s": med["treeflash_int4_tok_per_cpu_s"] / med["transformers_tok_per_cpu_s"],
        "all_same_tokens_until_eos": all(x["same_tokens_until_eos"] for x in rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"median decode: treeflash fp32 {ours:.1f} tok/s ({ours / theirs:.2f}x), int4 {q4:.1f} tok/s ({q4 / theirs:.2f}x), "
          f"transformers {theirs:.1f} tok/s; per CPU-second: {result['ratio_per_cpu_s']:.2f}x and {result['ratio_int4_per_cpu_s']:.2f}x")


if __name__ == "__main__":
    main()
