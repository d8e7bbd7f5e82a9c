"""Where a long prefill's time goes: the CUDA kernels of one chunked prefill of a random-weight model
at a real shape, fewer layers (the per-layer work is the same), through torch.profiler.

    python bench/gpu_prefill_profile.py --shape qwen3-8b --layers 4 --tokens 32768 --out out/prefill_profile.json

Writes the top kernels by CUDA time and the wall time per layer, to compare with gpu_speed's prefill.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_shapes import SHAPES, build_model  # noqa: E402
from treeflash.models.step import StepInput  # noqa: E402


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="out/prefill_profile.json")
    args = p.parse_args()
    model = build_model(args.shape, device="cuda", layers=args.layers).fuse_projections()
    ids = torch.randint(0, model.config.vocab_size, (args.tokens,), device="cuda")
    cache = model.new_cache(args.tokens + 8)

    def prefill():
        cache.reset()
        for s in range(0, args.tokens, args.chunk):
            model(StepInput.plain(ids[s : s + args.chunk], s), cache, compute_logits=False)
        torch.cuda.synchronize()

    prefill()  # warm-up (compiles)
    t0 = time.perf_counter()
    prefill()
    wall = time.perf_counter() - t0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        prefill()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[: args.top]:
        rows.append({"name": e.key[:160], "cuda_ms": e.device_time_total / 1e3, "calls": e.count})
    res = {"shape": args.shape, "layers": args.layers, "tokens": args.tokens, "chunk": args.chunk,
           "wall_s": wall, "wall_s_per_layer": wall / args.layers, "top": rows,
           "torch": torch.__version__,
           "sdpa_backends": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                             "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                             "cudnn": torch.backends.cuda.cudnn_sdp_enabled()}}
    print(f"{args.shape} x{args.layers} layers, {args.tokens} tokens: {wall:.2f} s ({wall / args.layers:.3f} s/layer)")
    for r in rows:
        print(f"  {r['cuda_ms']:10.1f} ms {r['calls']:6d}  {r['name']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
