"""Decode speed at long context for each KV cache type: a random-weight model at a real shape,
one token per step through the CUDA-graph runner, the cache filled to `--contexts` tokens.

Speed does not depend on the values in the cache or the weights, so the cache is not prefilled:
its committed length is set directly (the rows hold zeros / zero codes) and the recurrent
states of a hybrid model stay zero. Every decode step still reads every weight once and every
cached row up to the committed length in the type's own layout. No tau or quality is measured
here (that is bench/kv_quality.py, on real weights).

Reports per (context, K/V type): tokens/s, graph-only step time, bytes one step must read
(weights + KV in the type's layout + recurrent state), that as a fraction of the measured copy
bandwidth, and the KV cache's size. Writes JSON after every row.

    python -m bench.kv_long_decode --shape qwen3.5-27b --contexts 32768,131072 \
        --types bf16/bf16,q8_0/q8_0,q4_0/q4_0,tq3_0/tq3_0 --out bench/results/kv_long_decode.json
    python -m bench.kv_long_decode --contexts 131072 --types q8_0/q8_0,q8_0/q8_0:norot   # the key rotation's cost
    python -m bench.kv_long_decode --shape qwen3.5-27b:q4_k_m --contexts 512,8192,32768,131072,262144 \
        --types bf16/bf16,q8_0/q8_0,q4_0/q4_0,q8_0/tq3_0,tq3_0/tq3_0 --out $OUT/kv_table_q4km.json   # the [kv2] table
    python -m bench.kv_long_decode --shape tiny-hybrid --contexts 256 --decode-tokens 4   # CPU check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch


from bench.gpu_shapes import (DEV, SHAPES, build_model, cuda_time, measure_bandwidth, quant_model, state_bytes, wall_time,
                              weight_bytes)

from treeflash.kernels.kv.kv_formats import bytes_per_token_per_layer
from treeflash.models.runner import CudaGraphRunner
from treeflash.models.step import StepInput


@torch.inference_mode()
def one(model, context: int, type_k: str, type_v: str, decode_tokens: int, bandwidth: float, rotate_keys: bool = True) -> dict:
    c = model.config
    cache = model.new_cache(context + decode_tokens + 16, type_k, type_v, rotate_keys=rotate_keys)
    runner = CudaGraphRunner(model, cache, buckets=(1,))
    cache.seq_len = context  # the rows stand in for a prefilled context (values do not change the speed)
    tok = torch.zeros(1, dtype=torch.long, device=model.device)

    def step():
        out = runner.forward(StepInput.plain(tok, cache.seq_len))
        return int(out.logits[0].argmax())  # the host reads the token back, as the decoder does

    t = wall_time(step, iters=decode_tokens, warmup=3)
    g = cuda_time(lambda: runner.decode.replay(), iters=10, warmup=2) if runner.decode is not None else t
    kv_row = bytes_per_token_per_layer(type_k, c.num_kv_heads, c.head_dim, type_v, model.dtype)
    kv = len(c.attention_layer_ids) * kv_row * cache.seq_len
    nbytes = weight_bytes(model) + kv + state_bytes(model)
    row = {"context": context, "cache_type_k": type_k, "cache_type_v": type_v, "rotate_keys": rotate_keys,
           "tokens_per_s": 1 / t, "step_ms": t * 1e3, "graph_ms": g * 1e3,
           "kv_bytes_read_gb": kv / 1e9, "bytes_per_token_gb": nbytes / 1e9,
           "kv_cache_gb": cache.nbytes() / 1e9 if hasattr(cache, "nbytes") else None,
           "fraction_of_roofline": nbytes / t / bandwidth, "graph_fraction_of_roofline": nbytes / g / bandwidth}
    runner = cache = None  # freed before empty_cache (step() and the row are done with them)
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3.5-27b", help=f"one of {', '.join(sorted(SHAPES))}, or SHAPE:MIX for a random GGUF "
                   "kept quantized (mixes of treeflash/models/gguf_synth.py, e.g. qwen3.5-27b:q4_k_m)")
    p.add_argument("--gguf-dir", default="/tmp/treeflash-gguf", help="where SHAPE:MIX files are written and reused")
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[32768, 131072])
    p.add_argument("--types", default="bf16/bf16,q8_0/q8_0,q4_0/q4_0,tq3_0/tq3_0",
                   help="comma-separated K/V pairs, e.g. bf16/bf16,tq3_0/tq3_0; a ':norot' suffix stores q8_0 / q4_0 "
                        "keys unrotated (CacheSpec.rotate_keys=False), e.g. q8_0/q8_0:norot")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--out", default="bench/results/kv_long_decode.json")
    args = p.parse_args()
    if args.shape.partition(":")[0] not in SHAPES:
        p.error(f"--shape: unknown shape {args.shape.partition(':')[0]!r}; one of {', '.join(sorted(SHAPES))}")
    pairs = []
    for x in args.types.split(","):
        x, _, flag = x.partition(":")
        if flag not in ("", "norot"):
            p.error(f"--types: unknown suffix ':{flag}' in {x}:{flag} (only ':norot')")
        k, v = x.split("/") if "/" in x else (x, x)
        pairs.append((k, v, flag != "norot"))
    bw = measure_bandwidth(4.0 if DEV == "cuda" else 0.25)
    t0 = time.perf_counter()
    extra = {}
    if ":" in args.shape:
        model, extra = quant_model(args.shape, args.gguf_dir)
    else:
        model = build_model(args.shape)
    model.fuse_projections()
    result = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "shape": args.shape, "copy_bandwidth_gb_s": bw / 1e9,
              "weight_gb": weight_bytes(model) / 1e9, "build_s": time.perf_counter() - t0, **extra,
              "command": "python -m bench.kv_long_decode " + " ".join(sys.argv[1:]), "rows": []}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; {args.shape} weights {result['weight_gb']:.1f} GB", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for ctx in args.contexts:
        for k, v, rot in pairs:
            try:
                row = one(model, ctx, k, v, args.decode_tokens, bw, rot)
            except torch.OutOfMemoryError as e:
                row = {"context": ctx, "cache_type_k": k, "cache_type_v": v, "error": str(e)[:200]}
                torch.cuda.empty_cache()
            first = next((r for r in result["rows"] if (r["cache_type_k"], r["cache_type_v"], r.get("rotate_keys")) == (k, v, rot)
                          and "error" not in r), None)
            if "error" not in row and first is not None:
                row["vs_context"] = first["context"]  # the slowdown against the same pair at the run's first context
                row["speed_vs_first_context"] = row["tokens_per_s"] / first["tokens_per_s"]
            result["rows"].append(row)
            if "error" not in row:
                print(f"ctx {ctx:>7} {k:>5}/{v:<5}{'' if rot else ' norot'}: {row['tokens_per_s']:6.1f} tok/s, step {row['step_ms']:.2f} ms "
                      f"(graph {row['graph_ms']:.2f}), KV read {row['kv_bytes_read_gb']:.2f} GB, "
                      f"{row['fraction_of_roofline']:.0%} of roofline"
                      + (f", {row['speed_vs_first_context']:.2f}x its speed at {row['vs_context']}" if "vs_context" in row else ""), flush=True)
            else:
                print(f"ctx {ctx} {k}/{v}: {row['error']}", flush=True)
            out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
