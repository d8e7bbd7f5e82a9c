"""Real GGUF weights kept in their blocks give what the dequantized model gives (CPU).

For each model: greedy text on 5 chat prompts and the perplexity of a held-out text (a slice of a
Python standard-library source), three ways:
- dequantized: every tensor to fp32 at load (`--weights float`), the reference;
- blocks: every matrix kept as its GGUF blocks (models/quant_linear.py), run through the reference
  path (dequantize + matmul in fp32 per call; what the CUDA kernels must equal): the same tokens;
- native: `--weights native` on the CPU (Q4_0/Q4_1/Q4_K through torch's int4 kernel at bf16-level
  precision, the rest dequantized): tokens may flip at near-ties, so its perplexity is compared.
Writes JSON.

examples:
  python -m bench.quant_real_check --out /tmp/quant_real.json                       # the default model + the 0.5B if cached
  python -m bench.quant_real_check --models default --tokens 16 --out /tmp/q.json
  python -m bench.quant_real_check --models ~/.cache/treeflash/pairs/qwen2.5-coder-0.5b-instruct.gguf --out /tmp/q05.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
from pathlib import Path

import torch

from treeflash.models.loader import build_model, load_model, open_checkpoint
from treeflash.models.step import StepInput

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "Explain what a hash table is in one sentence.",
    "Write quicksort in Python.",
    "List three prime numbers.",
]
QWEN_05B = Path.home() / ".cache" / "treeflash" / "pairs" / "qwen2.5-coder-0.5b-instruct.gguf"


@torch.inference_mode()
def greedy(model, ids: list[int], n: int) -> list[int]:
    cache = model.new_cache(len(ids) + n + 1)
    logits = model(StepInput.plain(torch.tensor(ids), 0), cache).logits[-1]
    out = []
    for _ in range(n):
        tok = int(logits.argmax())
        out.append(tok)
        logits = model(StepInput.plain(torch.tensor([tok]), cache.seq_len), cache).logits[-1]
    return out


@torch.inference_mode()
def perplexity(model, ids: list[int]) -> float:
    logits = model(StepInput.plain(torch.tensor(ids), 0), model.new_cache(len(ids) + 1)).logits
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:]))
    return math.exp(float(nll))


def check(path: str | None, args) -> dict:
    """The three ways one after another, one model in memory at a time (three copies of a 1.5B model in fp32
    do not fit a 24 GiB machine beside anything else)."""
    ref = load_model(path, device="cpu", dtype=torch.float32, progress=False)
    tok, source, template = ref.tokenizer, ref.source, ref.chat_template
    held_out = tok(inspect.getsource(json.decoder))["input_ids"][: args.ppl_tokens]
    prompts = PROMPTS[: args.prompts]
    prompt_ids = []
    for prompt in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False,
                                       chat_template=template) if template else prompt
        prompt_ids.append(tok(text, add_special_tokens=False)["input_ids"])
    res: dict = {"source": source, "prompts": []}
    texts: dict[str, list[str]] = {}
    for name in ("dequantized", "blocks", "native"):
        if name == "blocks":
            model = build_model(open_checkpoint(source), torch.device("cpu"), torch.float32, progress=False,
                                keep_quantized=lambda fmt: True)
        elif name == "native":
            native = load_model(path, device="cpu", dtype=torch.float32, progress=False, weights="native")
            model, res["weights_native"] = native.model, native.weight_plan
            native = None
        else:
            model, ref = ref.model, None
        t0 = time.perf_counter()
        res[f"ppl_{name}"] = perplexity(model, held_out)
        res[f"ppl_{name}_s"] = time.perf_counter() - t0
        texts[name] = [tok.decode(greedy(model, ids, args.tokens)) for ids in prompt_ids]
        model = None  # freed before the next way is built
        print(f"  {name}: ppl {res[f'ppl_{name}']:.4f}, {len(prompts)} prompts", flush=True)
    for i, prompt in enumerate(prompts):
        row = {"prompt": prompt, **{name: texts[name][i] for name in texts}}
        row["blocks_same"] = row["blocks"] == row["dequantized"]
        row["native_same"] = row["native"] == row["dequantized"]
        res["prompts"].append(row)
        print(json.dumps(row), flush=True)
    res["blocks_all_same"] = all(r["blocks_same"] for r in res["prompts"])
    res["native_same"] = sum(r["native_same"] for r in res["prompts"])
    res["ppl_blocks_rel"] = res["ppl_blocks"] / res["ppl_dequantized"] - 1
    res["ppl_native_rel"] = res["ppl_native"] / res["ppl_dequantized"] - 1
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="default,qwen0.5b", help="comma list: default, qwen0.5b (if cached), or .gguf paths")
    p.add_argument("--prompts", type=int, default=5)
    p.add_argument("--tokens", type=int, default=24, help="greedy tokens per prompt")
    p.add_argument("--ppl-tokens", type=int, default=256, help="held-out tokens for the perplexity")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"args": vars(args), "torch": torch.__version__, "models": {}}
    for m in args.models.split(","):
        path = None if m == "default" else str(QWEN_05B) if m == "qwen0.5b" else m
        if path is not None and not Path(path).expanduser().is_file():
            result["models"][m] = {"skipped": f"{path} not found (bench/spec_pair_cpu.py fetches it)"}
            continue
        result["models"][m] = check(path, args)
        r = result["models"][m]
        print(f"{m}: blocks same text {r['blocks_all_same']}, native same {r['native_same']}/{len(r['prompts'])}; ppl "
              f"{r['ppl_dequantized']:.4f} / blocks {r['ppl_blocks_rel']:+.2e} / native {r['ppl_native_rel']:+.2%}", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
