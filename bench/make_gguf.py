"""Write a random-weight GGUF at a real model shape and type mix (treeflash/models/gguf_synth.py).

For speed and memory work without real weights: llama.cpp's tensor names and metadata, each tensor in
the type the mix gives it, random blocks with a fixed sane scale per type (outputs stay finite).
Streams tensor by tensor; a 27B Q4_K_M (16.7 GB) is written at disk speed. Prints a JSON summary
(and writes it to --json if given): bytes per type, tensor counts, seconds.

examples:
  python -m bench.make_gguf --shape qwen3.5-27b --mix q4_k_m --out /tmp/qwen3.5-27b-q4_k_m.gguf
  python -m bench.make_gguf --shape qwen3.5-27b --mix ud-q3_k_xl --out /tmp/qwen3.5-27b-ud-q3_k_xl.gguf
  python -m bench.make_gguf --shape qwen3-8b --mix q4_k_m --out /tmp/qwen3-8b-q4_k_m.gguf
  python -m bench.make_gguf --shape tiny-hybrid --mix q4_k_m --out /tmp/tiny.gguf --json /tmp/tiny.json
  python -m bench.make_gguf --list        # the shapes and mixes, with each file's size
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from gguf import GGML_QUANT_SIZES

from treeflash.models.gguf_synth import MIXES, SHAPES, plan_bytes, tensor_plan, write_synth_gguf


def summary(shape: str, mix: str) -> dict:
    by_type: Counter = Counter()
    count: Counter = Counter()
    for t in tensor_plan(SHAPES[shape], mix):
        values, size = GGML_QUANT_SIZES[t.qtype]
        n = 1
        for d in t.shape:
            n *= d
        by_type[t.qtype.name] += n // values * size
        count[t.qtype.name] += 1
    return {"shape": shape, "mix": mix, "tensor_bytes": plan_bytes(SHAPES[shape], mix),
            "bytes_by_type": dict(by_type), "tensors_by_type": dict(count)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), help="model shape")
    p.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m", help="type mix (default q4_k_m)")
    p.add_argument("--out", help="the .gguf file to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument("--list", action="store_true", help="print every shape x mix with its size and exit")
    args = p.parse_args()
    if args.list:
        for shape in SHAPES:
            for mix in MIXES:
                print(f"{shape:14s} {mix:12s} {plan_bytes(SHAPES[shape], mix) / 1e9:8.3f} GB")
        return
    if not args.shape or not args.out:
        p.error("--shape and --out are needed (or --list)")
    t0 = time.perf_counter()
    write_synth_gguf(args.out, args.shape, args.mix, seed=args.seed)
    res = summary(args.shape, args.mix) | {"path": args.out, "file_bytes": Path(args.out).stat().st_size,
                                           "seconds": time.perf_counter() - t0}
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
