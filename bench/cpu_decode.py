"""Decode speed of the embedded default (SmolLM2-135M-Instruct) on this CPU: treeflash against
transformers' generate on the same GGUF, same dtype (fp32), same prompts, interleaved in one run.

    python bench/cpu_decode.py --out docs/results/cpu_decode.json

Decode tokens/s = (tokens - 1) / (time after the first token); both sides greedy, EOS ignored.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash.engine.chat import render_chat  # noqa: E402
from treeflash.models.default_model import default_model_path  # noqa: E402
from treeflash.models.loader import load_model  # noqa: E402
from treeflash.spec.decoder import Decoder  # noqa: E402
from treeflash.spec.sampling import SamplingParams  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
]


@torch.inference_mode()
def ours_decode(loaded, ids: list[int], n: int) -> tuple[list[int], float]:
    model = loaded.model
    cache = model.new_cache(len(ids) + n + 8)
    dec = Decoder(model, cache, SamplingParams())
    out = [dec.prefill(ids)]
    t0 = time.perf_counter()
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], (n - 1) / (time.perf_counter() - t0)


@torch.inference_mode()
def hf_decode(hf, ids: list[int], n: int) -> tuple[list[int], float]:
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):  # stamps the time when the first token's logits are processed
        def __init__(self):
            self.first = None

        def __call__(self, input_ids, scores):
            if self.first is None:
                self.first = time.perf_counter()
            return scores

    clock = Clock()
    x = torch.tensor([ids])
    out = hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, logits_processor=LogitsProcessorList([clock]))
    end = time.perf_counter()
    return out[0, len(ids):].tolist(), (n - 1) / (end - clock.first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    p.add_argument("--out", default="docs/results/cpu_decode.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    loaded = load_model(None, device="cpu", dtype=torch.float32, progress=False)
    loaded.model.fuse_projections()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    rows = []
    for r in range(args.rounds):
        for prompt in PROMPTS:
            text = render_chat(loaded.chat_template, [{"role": "user", "content": prompt}])
            ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
            a_ids, a = ours_decode(loaded, ids, args.tokens)
            b_ids, b = hf_decode(hf, ids, args.tokens)
            # transformers' min_new_tokens masks EOS, so compare the tokens before our first EOS
            eos = set(loaded.config.eos_token_ids)
            cut = next((i for i, t in enumerate(a_ids) if t in eos), len(a_ids))
            same = a_ids[:cut] == b_ids[:cut]
            rows.append({"round": r, "prompt": prompt, "treeflash_tok_s": a, "transformers_tok_s": b,
                         "same_tokens_until_eos": same, "compared_tokens": cut})
            print(f"round {r} {prompt[:30]!r}: treeflash {a:.1f} tok/s, transformers {b:.1f} tok/s, same tokens {same} ({cut})", flush=True)
    ours = statistics.median(x["treeflash_tok_s"] for x in rows)
    theirs = statistics.median(x["transformers_tok_s"] for x in rows)
    result = {
        "command": "python bench/cpu_decode.py " + " ".join(sys.argv[1:]),
        "load_average_1min_at_end": os.getloadavg()[0],
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "torch": torch.__version__, "model": str(path.name), "dtype": "float32", "tokens": args.tokens,
        "rows": rows, "median_treeflash_tok_s": ours, "median_transformers_tok_s": theirs, "ratio": ours / theirs,
        "all_same_tokens_until_eos": all(x["same_tokens_until_eos"] for x in rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"median decode: treeflash {ours:.1f} tok/s, transformers {theirs:.1f} tok/s, ratio {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
