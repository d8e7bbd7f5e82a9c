"""The M == 1 dp4a kernels side by side per projection: launch configurations, Q6_K's two kernels (one row a
thread, 32 threads a row) and the split over K finished in the kernel or by a split-sum launch.

Every route is first checked against x @ dequant(W)^T in fp32 (within 1e-2 of the largest value: x is
rounded to 8 bits), then timed as a CUDA graph over enough copies of the weight to defeat the L2 (each
copy with its own split counters, as a QuantLinear keeps them). The roofline is the blocks' bytes (+ x
and y) at --bandwidth. Writes JSON; prints one line per projection.

examples:
  python -m bench.dp4a_ab --out /tmp/dp4a_ab.json                          # every projection (H200: ~2 min)
  python -m bench.dp4a_ab --only 27b.down.q6_k,27b.head.q6_k --out /tmp/q6.json
  python -m bench.dp4a_ab --toy --out /tmp/dp4a_ab.json                    # CPU check of the script (interpreter)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from bench.quant_gemv import MIN_BYTES_PER_REPLAY, time_calls
from treeflash.kernels.quant import FORMATS, dequantize_ref, quant_matmul
from treeflash.kernels.quant.config import Dp4aConfig, QuantTuning
from treeflash.kernels.quant.split_k import tile_counters
from treeflash.kernels.quant.synthetic import random_blocks

# name: (format, N, K): the 27B Q4_K_M decode step's M == 1 matrices, and the 8B's Q6_K down
PROJECTIONS = {
    "27b.gate_up.q4_k": ("Q4_K", 34816, 5120),
    "27b.down.q4_k": ("Q4_K", 5120, 17408),
    "27b.attn_qkv.q4_k": ("Q4_K", 14336, 5120),
    "27b.in_proj.q4_k": ("Q4_K", 16480, 5120),
    "27b.out.q4_k": ("Q4_K", 5120, 6144),
    "27b.down.q6_k": ("Q6_K", 5120, 17408),
    "27b.head.q6_k": ("Q6_K", 248320, 5120),
    "8b.down.q6_k": ("Q6_K", 4096, 12288),
    "27b.alpha_beta.q8_0": ("Q8_0", 96, 5120),
}
TOY = {"toy.q4_k": ("Q4_K", 48, 1024), "toy.q6_k": ("Q6_K", 40, 1024), "toy.q8_0": ("Q8_0", 24, 1024)}


def routes(fmt: str) -> list[tuple[str, QuantTuning]]:
    """(label, tuning) of each route timed for a format: the default first."""
    base = QuantTuning()
    fused = lambda c: dataclasses.replace(c, fused_split=True)  # noqa: E731
    if fmt == "Q4_K":
        out = [("default", base), ("fused", dataclasses.replace(base, q4k_dp4a=fused(base.q4k_dp4a)))]
        for bn, w, mp, fs in ((16, 4, 4224, False), (32, 4, 4224, False), (64, 4, 4224, False), (32, 8, 4224, False),
                              (32, 4, 1056, False), (32, 4, 4224, True)):  # eight threads a row, 16-byte loads
            out.append((f"lanes bn{bn} w{w} mp{mp}{' fused' if fs else ''}", dataclasses.replace(
                base, q4k_gemv_route="lanes", q4k_lanes=Dp4aConfig(block_n=bn, num_warps=w, min_programs=mp, fused_split=fs))))
        return out
    if fmt == "Q8_0":
        return [("default", base), ("fused", dataclasses.replace(base, q8_0_dp4a=fused(base.q8_0_dp4a)))]
    out = [("default", base), ("dp4a fused", dataclasses.replace(base, q6k_gemv_route="dp4a", q6k_dp4a=fused(base.q6k_dp4a)))]
    for bn, w in ((64, 2), (128, 4), (32, 1), (128, 8)):  # one row a thread: BLOCK_N == 32 warps has no replicated rows
        out.append((f"dp4a bn{bn} w{w}", dataclasses.replace(base, q6k_gemv_route="dp4a", q6k_dp4a=Dp4aConfig(block_n=bn, num_warps=w))))
    for bn, w, mp, fs in ((4, 4, 4224, False), (8, 4, 4224, False), (16, 4, 4224, False), (8, 8, 4224, False),
                          (8, 4, 1056, False), (16, 8, 2112, False), (8, 4, 4224, True)):
        out.append((f"lanes bn{bn} w{w} mp{mp}{' fused' if fs else ''}", dataclasses.replace(
            base, q6k_gemv_route="lanes", q6k_lanes=Dp4aConfig(block_n=bn, num_warps=w, min_programs=mp, fused_split=fs))))
    return out


def bench_projection(name: str, fmt: str, n: int, k: int, args) -> dict:
    dev = args.device
    w0 = random_blocks(fmt, n, k, torch.Generator().manual_seed(0), dev)  # [N, row bytes] uint8
    row_bytes = FORMATS[fmt].row_bytes(k)
    copies = max(1, -(-MIN_BYTES_PER_REPLAY // (n * row_bytes))) if dev == "cuda" else 1
    weights = [w0] + [w0.clone() for _ in range(copies - 1)]
    counters = [tile_counters(n, dev) for _ in weights]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    ref = x.float() @ dequantize_ref(w0, fmt, k).t()  # [1, N] fp32
    nbytes = n * row_bytes + 2 * k + 2 * n
    rec = dict(projection=name, format=fmt, n=n, k=k, copies=copies, bytes=nbytes, routes=[])
    for label, tuning in routes(fmt):
        try:
            y = quant_matmul(x, w0, fmt, k, out_dtype=torch.float32, tuning=tuning, counters=counters[0])
            err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            if not err <= 1e-2:
                rec["routes"].append(dict(route=label, error=err, failed="differs from the reference"))
                continue
            s = time_calls([lambda w=w, c=c, t=tuning: quant_matmul(x, w, fmt, k, tuning=t, counters=c)
                            for w, c in zip(weights, counters)], dev, args.rep_ms)
        except Exception as e:  # a configuration that does not compile or launch: recorded, not fatal
            rec["routes"].append(dict(route=label, failed=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        rec["routes"].append(dict(route=label, error=err, s=s, roofline_frac=nbytes / args.bandwidth / s))
    ok = [r for r in rec["routes"] if "s" in r]
    rec["best"] = min(ok, key=lambda r: r["s"])["route"] if ok else None
    us = {r["route"]: round(r["s"] * 1e6, 1) if "s" in r else r["failed"][:60] for r in rec["routes"]}
    print(json.dumps(dict(projection=name, roofline_us=round(nbytes / args.bandwidth * 1e6, 1), **us)), flush=True)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--only", default=None, help="comma-separated projection names (default: all)")
    p.add_argument("--bandwidth", type=float, default=4.2e12, help="bytes/s of the roofline (H200: 4.2e12)")
    p.add_argument("--rep-ms", type=int, default=40, help="milliseconds of graph replays per route")
    p.add_argument("--time-limit", type=float, default=240.0, help="seconds after which the remaining projections are skipped")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--toy", action="store_true", help="toy shapes (checks the script on the CPU: TRITON_INTERPRET=1)")
    args = p.parse_args(argv)
    shapes = TOY if args.toy else PROJECTIONS
    names = args.only.split(",") if args.only else list(shapes)
    for nm in names:
        if nm not in shapes:
            p.error(f"--only: unknown projection {nm!r} (known: {', '.join(shapes)})")
    deadline = time.monotonic() + args.time_limit
    results = []
    for nm in names:
        if time.monotonic() > deadline:
            results.append(dict(projection=nm, skipped=f"past --time-limit {args.time_limit} s"))
            continue
        results.append(bench_projection(nm, *shapes[nm], args))
        doc = dict(tool="dp4a_ab", device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   bandwidth=args.bandwidth, command=" ".join(sys.argv), results=results)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
