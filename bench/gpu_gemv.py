"""The one-row GEMV (kernels/linear/gemv.py) against cuBLAS at the decode projections of the Qwen3-8B and
Qwen3.5-27B shapes: time per call and the fraction of the copy bandwidth, for a sweep of launch
configurations. Each configuration is first checked against gemv_reference.

    python -m bench.gpu_gemv --out bench/results/gpu_gemv.json
    python -m bench.gpu_gemv --projections 8b.o,8b.down --max-configs 8
    python -m bench.gpu_gemv --projections 8b.swiglu,27b.swiglu --out bench/results/gpu_gemv_swiglu.json
    python -m bench.gpu_gemv --projections smol.qkv,smol.o,smol.down,smol.swiglu --out bench/results/gpu_gemv_smol.json
    python -m bench.gpu_gemv --rows-gemm-ab --out rows_gemm_ab.json   # batch-invariant rows_gemm vs today, M = 1..64

Timing: CUDA-graph replay (triton.testing.do_bench_cudagraph) of one call on
each of several copies of the weight in turn (>= 256 MB per round, 5x the L2), so every byte comes
from memory and the gaps between kernels count, as inside a decode graph. The configurations are
those with 132-1,100 programs and 2-16 unrolled steps (the H200 has 132 SMs).

--rows-gemm-ab: kernels/linear/rows_gemm.py (its rows_gemm_config) against today's path (projection.linear with
gemv.TUNED at M = 1: gemv for its shapes, else cuBLAS; F.linear at M > 1) at M in ROWS_GEMM_M on the 8B and 27B
projections; each path checked against rows_gemm_reference first, and rows_gemm's invariance on the GPU (every row
of M = 32 bitwise equal to that row alone, and to the first 32 rows of M = 64; cuBLAS's row 0 recorded beside it).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import json
import sys
import time
from pathlib import Path


import torch
import torch.nn.functional as F

from treeflash.kernels.pointwise.activation import silu_mul
from treeflash.kernels.linear.gemv import (GemvConfig, gemv, gemv_config, gemv_reference, gemv_swiglu,
                                    gemv_swiglu_reference)
from treeflash.kernels.linear import projection
from treeflash.kernels.linear.rows_gemm import rows_gemm, rows_gemm_config, rows_gemm_reference


def copy_bandwidth() -> float:
    """The card's device-to-device copy bandwidth, bytes read + written per second (the roofline's figure)."""
    from triton.testing import do_bench

    n = 2**31
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=20, rep=200, return_mode="median")
    del src, dst
    return 2 * n / (ms * 1e-3)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Enough random bf16 [n, k] weights that one round over them streams >= 256 MB (5x the L2): each
    timed call reads its weight from memory, as a model's layers do, not from a warm L2."""
    # at most 1024: SmolLM2's 0.7 MB weights need ~400 copies; with too few they stay in the L2 and
    # every kernel times 25-50% faster than inside a model's step graph
    copies = max(2, min(1024, -(-256_000_000 // (n * k * 2))))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]


def bench(fn, rep_ms: int = 60) -> float:
    """Seconds per call of fn, CUDA-graph replay (launch overhead excluded, gaps between kernels counted)."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e-3


PROJECTIONS = {  # name: (N, K)
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.down": (4096, 12288),
    "8b.gate_up": (24576, 4096),
    "27b.out": (5120, 6144),  # linear-attention out_proj and attention o_proj
    "27b.down": (5120, 17408),
    "27b.attn_qkv": (14336, 5120),
    "27b.in_proj": (16480, 5120),  # the Gated DeltaNet layers' fused q/k/v, z, b, a projection
    # SmolLM2-135M (the embedded default): cuBLAS takes ~3.9 us a call here, 464 us of a 0.9 ms decode
    # step (a kernel-by-kernel profile, bench/gpu_profile.py), for 0.16-0.9 us of bytes each
    "smol.qkv": (960, 576),
    "smol.o": (576, 576),
    "smol.down": (576, 1536),
}


GRIDS = {  # (block_n, split_k, block_k, warps) choices
    "wide": ((4, 8, 16, 32), (1, 2, 3, 4, 6, 8), (256, 512, 1024), (4, 8)),  # the first sweep
    "focus": ((2, 4, 8, 16), (1, 2, 3, 4), (1024, 2048), (4, 8)),  # around its winners: long unrolled steps, few rows
}


def candidates(n: int, k: int, grid: str = "wide", sms: int = 132) -> list[GemvConfig]:
    out = []
    for bn, split, bk, warps in itertools.product(*GRIDS[grid]):
        programs = -(-n // bn) * split
        k_split = -(-(-(-k // split)) // bk) * bk
        steps = k_split // bk
        if sms <= programs <= 2200 and 2 <= steps <= 16 and bn * bk <= 16384:
            out.append(GemvConfig(bn, bk, split, warps))
    return out


def _sweep(name: str, n: int, k: int, bw: float, reference, baseline, kernel, cfgs: list[GemvConfig],
           default: GemvConfig | None = None, **meta) -> dict:
    """Time `baseline(x, w)` ("cublas") and `kernel(x, w, config=cfg)` for each configuration, every
    weight byte from memory, each configuration first checked against `reference` and for repeatability."""
    nbytes = n * k * 2
    ws = weight_copies(n, k)
    copies = len(ws)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = reference(x, ws[0]).float()
    scale = ref.abs().max().item()
    out: dict = {"name": name, "N": n, "K": k, **meta, "weight_mb": nbytes / 1e6, "weight_copies": copies}

    def timed(fn) -> dict:
        def run():
            for w in ws:
                fn(w)
        t = bench(run) / copies
        return {"us": t * 1e6, "fraction": nbytes / t / bw}

    out["cublas"] = timed(lambda w: baseline(x, w))
    for cfg in cfgs:
        key = f"n{cfg.block_n}_k{cfg.block_k}_s{cfg.split_k}_w{cfg.num_warps}" + (" (default)" if cfg == default else "")
        try:
            y = kernel(x, ws[0], config=cfg)
            err = (y.float() - ref).abs().max().item() / scale
            same = bool(torch.equal(y, kernel(x, ws[0], config=cfg)))
            out[key] = {**timed(lambda w: kernel(x, w, config=cfg)), "rel_err": err, "repeatable": same}
        except Exception as e:  # record and go on
            out[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    del ws
    return out


def run_projection(name: str, bw: float, max_configs: int, grid: str) -> dict:
    n, k = PROJECTIONS[name]
    default = gemv_config(n, k) or GemvConfig(8, 512, 1, 4)
    others = [c for c in candidates(n, k, grid) if c != default]
    random.Random(0).shuffle(others)  # a spread over the grid, the same every run
    return _sweep(name, n, k, bw, gemv_reference, F.linear, gemv, [default] + others[: max_configs - 1], default)


SWIGLU = {"8b.swiglu": (24576, 4096), "27b.swiglu": (34816, 5120), "smol.swiglu": (3072, 576)}  # gate_up [2I, K]
SWIGLU_GRID = [(bn, bk, w) for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (4, 8) if bn * bk <= 8192]


def run_swiglu(name: str, bw: float) -> dict:
    """gemv_swiglu (gate and up rows in one program, SiLU-mul in the epilogue) against cuBLAS on
    gate_up followed by the silu_mul kernel: what the decode step's MLP input half costs either way."""
    n, k = SWIGLU[name]
    cfgs = [GemvConfig(bn, bk, 1, w) for bn, bk, w in SWIGLU_GRID]
    return _sweep(name, n, k, bw, gemv_swiglu_reference, lambda x, w: silu_mul(F.linear(x, w)), gemv_swiglu, cfgs, swiglu=True)


ROWS_GEMM_M = (1, 2, 8, 32, 64)
ROWS_GEMM_PROJECTIONS = "8b.qkv,8b.o,8b.down,8b.gate_up,27b.out,27b.down,27b.attn_qkv,27b.in_proj"


def run_rows_gemm_ab(name: str, bw: float) -> dict:
    """One projection: rows_gemm and today's path at each M (us, fraction of the weight bytes' roofline, error
    against the reference), then the invariance checks."""
    n, k = PROJECTIONS[name]
    nbytes = n * k * 2
    ws = weight_copies(n, k)
    cfg = rows_gemm_config(n, k)
    xs = torch.randn(max(ROWS_GEMM_M), k, device=ws[0].device, dtype=ws[0].dtype)
    out: dict = {"name": name, "N": n, "K": k, "config": dataclasses.asdict(cfg), "weight_copies": len(ws), "rows": []}
    paths = {"rows_gemm": lambda x, w: rows_gemm(x, w, config=cfg),
             "today": lambda x, w: projection.linear(x, w) if x.shape[0] == 1 else F.linear(x, w)}
    for m in ROWS_GEMM_M:
        x = xs[:m]
        ref = rows_gemm_reference(x, ws[0]).float()
        row: dict = {"m": m}
        for path, fn in paths.items():
            err = ((fn(x, ws[0]).float() - ref).abs().max() / ref.abs().max()).item()
            def run(fn=fn, x=x):
                for w in ws:
                    fn(x, w)
            t = bench(run, rep_ms=30) / len(ws)  # 80 timings: half the sweep's replay time each
            row[path] = {"us": t * 1e6, "fraction": nbytes / t / bw, "rel_err": err}
        out["rows"].append(row)
    w = ws[0]
    y32, y64 = rows_gemm(xs[:32], w, config=cfg), rows_gemm(xs[:64], w, config=cfg)
    alone = torch.cat([rows_gemm(xs[i:i + 1], w, config=cfg) for i in range(32)])
    out["invariant_row0"] = bool(torch.equal(y32[0], alone[0]))
    out["invariant_all"] = bool(torch.equal(y32, alone) and torch.equal(y64[:32], y32))
    out["today_invariant_row0"] = bool(torch.equal(F.linear(xs[:32], w)[0], projection.linear(xs[:1], w)[0]))
    del ws
    return out


def rows_gemm_ab(args, bw: float, result: dict) -> None:
    """--rows-gemm-ab over the projections (those left after --time-limit seconds skipped), JSON after each."""
    t0 = time.perf_counter()
    names = (args.projections or ROWS_GEMM_PROJECTIONS).split(",")
    result["m"] = list(ROWS_GEMM_M)
    for name in names:
        if time.perf_counter() - t0 > args.time_limit:
            result.setdefault("skipped", []).append(name)
            continue
        r = run_rows_gemm_ab(name, bw)
        result["runs"].append(r)
        cells = "  ".join(f"M={row['m']}: {row['rows_gemm']['us']:.1f}/{row['today']['us']:.1f} us"
                          f" ({row['rows_gemm']['fraction']:.0%}/{row['today']['fraction']:.0%})" for row in r["rows"])
        bad = [row["m"] for row in r["rows"] if row["rows_gemm"]["rel_err"] > 2**-7 or row["today"]["rel_err"] > 2**-7]
        print(f"{name:12s} rows_gemm/today {cells}  invariant {r['invariant_all']} (cuBLAS row 0: "
              f"{r['today_invariant_row0']})  wrong M {bad}  [{time.perf_counter() - t0:.0f}s]", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--projections", default=None,
                   help="comma-separated PROJECTIONS / SWIGLU names (default: a sweep's six, or --rows-gemm-ab's eight)")
    p.add_argument("--max-configs", type=int, default=24, help="at most this many configurations per projection")
    p.add_argument("--grid", choices=sorted(GRIDS), default="wide", help="which configuration grid to sample")
    p.add_argument("--out", default="bench/results/gpu_gemv.json")
    p.add_argument("--rows-gemm-ab", action="store_true",
                   help="rows_gemm (batch-invariant, M = 1..64) against today's gemv / cuBLAS path (--grid, --max-configs ignored)")
    p.add_argument("--time-limit", type=float, default=120.0, help="--rows-gemm-ab: skip the projections left after this many seconds")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_gemv.py needs a CUDA GPU (the kernel's correctness on the CPU: tests/kernels/linear/test_gemv.py)")
    bw = copy_bandwidth()
    result = {"grid": args.grid, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_gb_s": bw / 1e9, "runs": []}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    if args.rows_gemm_ab:
        rows_gemm_ab(args, bw, result)
        return
    t0 = time.perf_counter()
    for name in (args.projections or "8b.qkv,8b.o,8b.down,27b.out,27b.down,8b.gate_up").split(","):
        r = run_swiglu(name, bw) if name in SWIGLU else run_projection(name, bw, args.max_configs, args.grid)
        result["runs"].append(r)
        ok = {key: v for key, v in r.items() if isinstance(v, dict) and "us" in v and key != "cublas"}
        bad = [key for key, v in ok.items() if v["rel_err"] > 2**-7 or not v["repeatable"]]
        best = min(ok, key=lambda key: ok[key]["us"]) if ok else None
        line = f"{name:12s}: cublas {r['cublas']['us']:6.1f} us ({r['cublas']['fraction']:.0%})"
        if best:
            line += f"  best {ok[best]['us']:6.1f} us ({ok[best]['fraction']:.0%}) {best}"
        d = next((key for key in ok if key.endswith("(default)")), None)
        if d:
            line += f"  default {ok[d]['us']:6.1f} us"
        print(line + f"  wrong {bad}  [{time.perf_counter() - t0:.0f}s]", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
