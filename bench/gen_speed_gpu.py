"""Data generation for train-drafter: treeflash's BatchGenerator against transformers' generate, on
the same random-weight target, in one run (speed does not depend on the weights; no end token is
ever produced, so every row runs its full length).

    python -m bench.gen_speed_gpu --out bench/results/gen_speed.json                  # H200, ~2 minutes
    python -m bench.gen_speed_gpu --shape tiny-dense --batches 8 --new 16 --hf-new 4  # CPU: checks the script

Reports, per engine and batch: generated tokens/s (rows x new tokens / wall seconds of the call)
and seconds per decode step; and an exactness check in fp32: the greedy answers of the batched
generator (CUDA graphs) against transformers' generate on the same prompts, rows identical.
Writes JSON after every measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


from bench.gpu_shapes import DEV, build_model, sync
from treeflash.train.batch_gen import BatchGenerator
from treeflash.train.features import TargetTwin


def prompts_for(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (k,), generator=g).tolist() for k in lens]


def timed(fn) -> tuple[float, object]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--batches", default="256,1024", help="rows per call, comma-separated")
    p.add_argument("--prompt-len", default="64,256", help="prompt lengths: uniform in [lo,hi]")
    p.add_argument("--new", type=int, default=384, help="new tokens per row (treeflash)")
    p.add_argument("--hf-new", type=int, default=32, help="new tokens per row for transformers' dynamic-cache generate")
    p.add_argument("--hf-static", action="store_true", help="also transformers' static cache (compiled on CUDA; slow to compile)")
    p.add_argument("--check-rows", type=int, default=32, help="rows of the fp32 exactness check (0: skip)")
    p.add_argument("--out", default="bench/results/gen_speed.json")
    args = p.parse_args()
    lo, hi = (int(x) for x in args.prompt_len.split(","))
    batches = [int(x) for x in args.batches.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"shape": args.shape, "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
                 "prompt_len": [lo, hi], "runs": []}

    def save():
        out.write_text(json.dumps(res, indent=2))

    model = build_model(args.shape)
    vocab = model.config.vocab_size
    gen = BatchGenerator(model, eos_ids=())
    twin = TargetTwin(model, (0,), eos_ids=(), pad_id=0, engine="hf")
    gen.generate(prompts_for(4, lo, hi, vocab, 99), 8)  # warm-up: kernels, cuBLAS handles
    for b in batches:
        prompts = prompts_for(b, lo, hi, vocab, b)
        for name, new, fn in (("treeflash", args.new, lambda: gen.generate(prompts, args.new)),
                              ("treeflash_sampled", args.new, lambda: gen.generate(prompts, args.new, temperature=0.8, seed=1)),
                              ("hf_dynamic", args.hf_new, lambda: twin.generate(prompts, args.hf_new))):
            sec, outs = timed(fn)
            tokens = sum(len(o.response_ids) for o in outs)
            row = {"engine": name, "batch": b, "new_tokens": new, "seconds": round(sec, 3), "tokens": tokens,
                   "tokens_per_s": round(tokens / sec, 1), "ms_per_step": round(1000 * sec / new, 2)}
            res["runs"].append(row)
            print(row, flush=True)
            save()
        if args.hf_static:
            static = TargetTwin(model, (0,), eos_ids=(), pad_id=0, static_shape=(b, hi), engine="hf")
            for call in ("first (compiles)", "second"):
                sec, outs = timed(lambda: static.generate(prompts, args.hf_new))
                tokens = sum(len(o.response_ids) for o in outs)
                row = {"engine": "hf_static", "call": call, "batch": b, "new_tokens": args.hf_new, "seconds": round(sec, 3),
                       "tokens_per_s": round(tokens / sec, 1), "ms_per_step": round(1000 * sec / args.hf_new, 2)}
                res["runs"].append(row)
                print(row, flush=True)
                save()
    if args.check_rows:
        m32 = build_model(args.shape, dtype=torch.float32)
        prompts = prompts_for(args.check_rows, lo, hi, vocab, 7)
        ours = BatchGenerator(m32, eos_ids=()).generate(prompts, 48)
        ref = TargetTwin(m32, (0,), eos_ids=(), pad_id=0, engine="hf").generate(prompts, 48)
        same = sum(a.response_ids == r.response_ids for a, r in zip(ours, ref))
        first_diff = [next((i for i, (x, y) in enumerate(zip(a.response_ids, r.response_ids)) if x != y), None)
                      for a, r in zip(ours, ref)]
        res["fp32_check"] = {"rows": len(prompts), "new_tokens": 48, "identical_rows": same,
                             "first_difference_per_row": first_diff}
        print("fp32 check:", res["fp32_check"], flush=True)
        save()


if __name__ == "__main__":
    main()
