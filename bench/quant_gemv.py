"""quant_matmul (treeflash/kernels/quant) at the projections of the Qwen3.5-27B and Qwen3-8B shapes:
time per call for each GGUF format and M in {1, 2, 4, 8, 16, 32, 64}, against the roofline of the
bytes it must read (the stored blocks + the activations + the output) and against a bf16 torch
matmul at the same shape. Each call is first checked against dequantize_ref + an fp32 matmul.

    python -m bench.quant_gemv --out quant_gemv.json                       # defaults: every format
    python -m bench.quant_gemv --formats Q4_K,Q6_K --rows 1,32 --out q.json
    python -m bench.quant_gemv --formats Q4_K --configs --rows 1,32 --out sweep.json   # launch-config sweep
    python -m bench.quant_gemv --formats Q4_K --rows 1 --q4k-ab --out ab.json   # word-wide Q4_K GEMV vs byte-wise
    python -m bench.quant_gemv --rows-ab --out rows_ab.json   # Q4_K at M = 2..64: generic vs rows_q4k vs mma vs mmq vs tiled vs bf16
    python -m bench.quant_gemv --device cpu --toy --out /tmp/q.json        # checks the script on a CPU

Timing: CUDA-graph replay (triton.testing.do_bench_cudagraph) of one graph that calls quant_matmul on
each of several copies of the weight in turn (>= 256 MB of blocks per replay, 5x the H200's L2), so
every block comes from memory and the launch gaps count as inside a decode graph; the figure is the
replay time divided by the number of copies. The roofline is bytes / --bandwidth (4.2e12 B/s, the
H200's HBM3e); "roofline_frac" = roofline time / measured time. With --configs each GEMV (M == 1) and
rows (M > 1) launch configuration of a small grid is timed too, and the best per (format, N, K)
comes out as ready-to-use QuantTuning table entries ("best_gemv_table", "best_rows_table").

--rows-ab: Q4_K at every projection and M in ROWS_AB_M through each QuantTuning.q4k_rows_route (at M == 1
each q4k_gemv_route: "words" gemv_q4k, "bytes" gemv_kernel, "q4k" rows_q4k; "best_speedup_vs_generic" is then
over "words") ("generic": kernels.rows_kernel, "q4k": rows_q4k at each configuration of Q4K_ROWS_GRID, "mma":
mma_q4k's of Q4K_MMA_GRID, "mmq": mmq_q4k's of Q4K_MMQ_GRID (x rounded to 8 bits: compare its error with dp4a's, not
with rows_q4k's), "tiled": dequantized tiles + torch matmul) beside bf16 F.linear and the shape's M == 1 decode GEMV, each
checked against dequantize_ref + an fp32 matmul first; "best" per (shape, M) and each route's time
over the M == 1 GEMV's ("vs_m1": the target is <= 1.5 at M = 32). Shorter timing windows
(ROWS_AB_REP_MS) and copies of one random weight keep it under --time-limit (default 170 s): past
it, the remaining rows are listed as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from treeflash.kernels.quant import FORMATS, dequantize_ref, has_kernel, quant_matmul
from treeflash.kernels.quant.config import GemvConfig, Dp4aConfig, MmqConfig, Q4kGemvConfig, Q4kMmaConfig, Q4kRowsConfig, QuantTuning, RowsConfig, split_for
from treeflash.kernels.quant import mmq_q4k
from treeflash.kernels.quant.rows_q4k import block_m_for
from treeflash.kernels.quant.synthetic import random_blocks

PROJECTIONS = {  # name: (N, K)
    "27b.attn_qkv": (14336, 5120),  # gated attention: q + gate 2 x 24 x 256, k and v 4 x 256
    "27b.in_proj": (16480, 5120),  # Gated DeltaNet: q, k 16 x 128, v 48 x 128, z 48 x 128, b, a 48
    "27b.out": (5120, 6144),  # attention o_proj and the Gated DeltaNet out_proj
    "27b.gate_up": (34816, 5120),
    "27b.down": (5120, 17408),
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (24576, 4096),
    "8b.down": (4096, 12288),
}
TOY = {"toy.qkv": (96, 512), "toy.down": (64, 1024)}
ROWS = (1, 2, 4, 8, 16, 32, 64)
GEMV_GRID = [GemvConfig(bn, u, w) for bn, u, w in itertools.product((2, 4, 8, 16, 32), (1, 2, 4), (2, 4, 8))]
ROWS_GRID = [RowsConfig(16, bn, w) for bn, w in itertools.product((16, 32, 64, 128), (2, 4, 8))]
Q4K_GRID = [Q4kGemvConfig(bn, u, w, mp, xt) for bn, u, w, mp, xt in
            ((16, 2, 1, 2048, False), (16, 2, 1, 2048, True), (32, 2, 1, 2048, True), (16, 4, 1, 2048, True), (32, 2, 2, 1024, True),
             (16, 2, 1, 4096, True), (32, 2, 1, 2048, False), (16, 4, 1, 2048, False))]
MIN_BYTES_PER_REPLAY = 256 << 20
ROWS_AB_M = (1, 2, 8, 16, 32, 64)  # M == 1: the decode GEMV routes against rows_q4k padded to 16 rows
# rows_q4k's configurations in --rows-ab (each a compile per K and BLOCK_M: keep it short): the default,
# 128 weight rows over two warpgroups (x re-read from L2 half as often), the default without a split over K
# (timed only where the default splits)
Q4K_ROWS_GRID = (Q4kRowsConfig(), Q4kRowsConfig(block_n=128, num_warps=8), Q4kRowsConfig(min_programs=1))
# mma_q4k's configurations (exact codes into the tensor cores, scales after the dot): the default (M == 1:
# "diag"), the per-group form, shallower / deeper pipelines, two warpgroups, a wider split; M > 1 runs
# "group" whatever the field says, so only the configurations that differ in launch are timed there
# dp4a_q4k's configurations at M == 1 in --rows-ab: the default, narrower / wider programs, no unrolling, a deeper split
Q4K_DP4A_GRID = (Dp4aConfig(), Dp4aConfig(min_programs=1056), Dp4aConfig(block_n=128),
                 Dp4aConfig(block_n=128, min_programs=1056), Dp4aConfig(prefetch=True),
                 Dp4aConfig(prefetch=True, min_programs=1056), Dp4aConfig(prefetch=True, block_n=128),
                 Dp4aConfig(unroll=4), Dp4aConfig(min_programs=8448))
Q4K_MMA_GRID = (Q4kMmaConfig(), Q4kMmaConfig(sums_dot=False), Q4kMmaConfig(num_stages=3), Q4kMmaConfig(min_programs=264),
                Q4kMmaConfig(scale="group"), Q4kMmaConfig(block_n=128, num_warps=8))
# mmq_q4k's configurations at M > 1 (x rounded to 8 bits, int8 dots): the default, a deeper split (4 programs per SM),
# no split, a deeper pipeline, two warpgroups of 64 weight rows, x's tile at most 32 rows (M = 64: two tiles)
Q4K_MMQ_GRID = (MmqConfig(), MmqConfig(min_programs=528), MmqConfig(min_programs=1), MmqConfig(num_stages=3),
                MmqConfig(block_n=128, num_warps=8), MmqConfig(block_m=32))
ROWS_AB_REP_MS = 20


def time_calls(fns: list, device: str, rep_ms: int = 200) -> float:
    """Median seconds of one call, replaying a CUDA graph of all fns in turn (wall clock off CUDA)."""
    def step():
        for fn in fns:
            fn()
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench_cudagraph(step, rep=rep_ms, return_mode="median") / 1000 / len(fns)
    step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / len(fns)


def check(x: torch.Tensor, blocks: torch.Tensor, fmt: str, k: int, tuning: QuantTuning) -> float:
    """Max error of quant_matmul against dequantize_ref + an fp32 matmul, relative to the largest value."""
    y = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=tuning)
    ref = x.float() @ dequantize_ref(blocks, fmt, k).t()
    return ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def bench_shape(fmt: str, name: str, n: int, k: int, rows: list[int], args, device: str) -> list[dict]:
    f = FORMATS[fmt]
    row_bytes = f.row_bytes(k)
    copies = max(1, -(-MIN_BYTES_PER_REPLAY // (n * row_bytes))) if device == "cuda" else 1
    gen = torch.Generator().manual_seed(0)
    weights = [random_blocks(fmt, n, k, gen, device) for _ in range(copies)]  # [N, row_bytes] uint8 each
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
             for _ in range(max(1, -(-MIN_BYTES_PER_REPLAY // (n * k * 2)) if device == "cuda" else 1))]
    out = []
    for m in rows:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        quant_bytes = n * row_bytes + m * k * 2 + m * n * 2
        bf16_bytes = n * k * 2 + m * k * 2 + m * n * 2
        configs: list[tuple[object, QuantTuning]] = [("default", QuantTuning())]
        if args.configs:
            grid = (GEMV_GRID if m == 1 else ROWS_GRID)[: 3 if args.toy else None]
            configs += [(c, QuantTuning(gemv=c) if m == 1 else QuantTuning(rows=c)) for c in grid]
        if args.q4k_ab and fmt == "Q4_K" and m == 1:  # the word-wide Q4_K GEMV's configurations against the byte-wise kernel
            configs += [("bytewise " + json.dumps(dataclasses.asdict(QuantTuning().gemv)), QuantTuning(q4k_gemv_route="bytes"))]
            configs += [("words " + json.dumps(dataclasses.asdict(c)), QuantTuning(q4k=c)) for c in Q4K_GRID[: 2 if args.toy else None]]
        rec = dict(format=fmt, projection=name, n=n, k=k, m=m, quant_bytes=quant_bytes, bf16_bytes=bf16_bytes,
                   has_kernel=has_kernel(fmt), copies=copies)
        rec["bf16_s"] = time_calls([lambda w=w: F.linear(x, w) for w in dense], device)
        rec["bf16_roofline_frac"] = bf16_bytes / args.bandwidth / rec["bf16_s"]
        timings = []
        for cfg, tuning in configs:
            label = cfg if isinstance(cfg, str) else dataclasses.asdict(cfg)
            try:
                err = check(x, weights[0], fmt, k, tuning)
                if not err <= 1e-2:  # bf16 x and output: a wrong kernel is far off, rounding is ~2^-8
                    timings.append(dict(config=label, error=err, failed="differs from the reference"))
                    continue
                s = time_calls([lambda w=w, t=tuning: quant_matmul(x, w, fmt, k, tuning=t) for w in weights], device)
            except Exception as e:  # a configuration that does not compile or launch: recorded, not fatal
                timings.append(dict(config=label, failed=f"{type(e).__name__}: {str(e)[:200]}"))
                continue
            timings.append(dict(config=label, error=err, s=s, roofline_frac=quant_bytes / args.bandwidth / s))
        ok = [t for t in timings if "s" in t]
        rec["default"] = timings[0]
        if len(configs) > 1:
            rec["configs"] = timings
            rec["best"] = min(ok, key=lambda t: t["s"]) if ok else None
        best = rec.get("best") or rec["default"]
        if "s" in best:
            rec["quant_s"] = best["s"]
            rec["roofline_frac"] = best["roofline_frac"]
            rec["speedup_vs_bf16"] = rec["bf16_s"] / best["s"]
        out.append(rec)
        print(json.dumps({key: rec.get(key) for key in ("format", "projection", "m", "quant_s", "roofline_frac", "bf16_s", "speedup_vs_bf16")}),
              file=sys.stderr, flush=True)
    return out


def q4k_routes(grid, n: int, k: int, m: int) -> list[tuple[str, dict, QuantTuning]]:
    """(label, config fields, tuning) of each rows_q4k configuration whose launch at (N, K, M) differs from an
    earlier one's (a config without a split launches as the default where the default does not split either)."""
    routes, seen = [], set()
    for i, c in enumerate(grid):
        bm = block_m_for(m, c)
        programs = -(-n // c.block_n) * -(-m // bm)
        launch = (c.block_n, c.num_warps, c.num_stages, bm, split_for(k // 256, programs, c.min_programs))
        if launch not in seen:
            seen.add(launch)
            routes.append((f"q4k{i}", dataclasses.asdict(c), QuantTuning(q4k_rows_route="q4k", q4k_gemv_route="q4k", q4k_rows=c)))
    return routes


def mma_routes(grid, n: int, k: int, m: int) -> list[tuple[str, dict, QuantTuning]]:
    """(label, config fields, tuning) of each mma_q4k configuration whose launch at (N, K, M) differs from an earlier one's."""
    routes, seen = [], set()
    for i, c in enumerate(grid):
        programs = -(-n // c.block_n) * -(-m // 16)
        launch = (c.block_n, c.num_warps, c.num_stages, (c.scale, c.sums_dot) if m == 1 else "group", split_for(k // 256, programs, c.min_programs))
        if launch not in seen:
            seen.add(launch)
            routes.append((f"mma{i}", dataclasses.asdict(c), QuantTuning(q4k_rows_route="mma", q4k_gemv_route="mma", q4k_mma=c)))
    return routes


def dp4a_routes(grid, n: int, k: int) -> list[tuple[str, dict, QuantTuning]]:
    """(label, config fields, tuning) of each dp4a_q4k configuration (M == 1) whose launch at (N, K) differs from an earlier one's."""
    routes, seen = [], set()
    for i, c in enumerate(grid):
        programs = -(-n // c.block_n)
        split = split_for(k // 256, programs, c.min_programs)
        launch = (c.block_n, c.num_warps, c.unroll if (k // 256 // split) % c.unroll == 0 and not c.prefetch else 1, c.prefetch, split)
        if launch not in seen:
            seen.add(launch)
            routes.append((f"dp4a{i}", dataclasses.asdict(c), QuantTuning(q4k_gemv_route="dp4a", q4k_dp4a=c)))
    return routes


def mmq_routes(grid, n: int, k: int, m: int) -> list[tuple[str, dict, QuantTuning]]:
    """(label, config fields, tuning) of each mmq_q4k configuration whose launch at (N, K, M) differs from an earlier one's."""
    routes, seen = [], set()
    for i, c in enumerate(grid):
        bm = mmq_q4k.block_m_for(m, c)
        launch = (c.block_n, mmq_q4k.warps_for(bm, c), c.num_stages, bm, mmq_q4k.mmq_split(n, k // 256, c))
        if launch not in seen:
            seen.add(launch)
            routes.append((f"mmq{i}", dataclasses.asdict(c), QuantTuning(q4k_rows_route="mmq", q4k_mmq=c)))
    return routes


def rows_ab_setup(name: str, n: int, k: int, args) -> dict:
    """One projection's tensors for --rows-ab (>= MIN_BYTES_PER_REPLAY of blocks and of bf16 weights) and its
    M == 1 decode GEMV (the default route), checked then timed."""
    device, fmt = args.device, "Q4_K"
    w0 = random_blocks(fmt, n, k, torch.Generator().manual_seed(0), device)  # [N, row_bytes] uint8
    row_bytes = FORMATS[fmt].row_bytes(k)
    copies = max(1, -(-MIN_BYTES_PER_REPLAY // (n * row_bytes))) if device == "cuda" else 1
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
             for _ in range(max(1, -(-MIN_BYTES_PER_REPLAY // (n * k * 2)) if device == "cuda" else 1))]
    st = dict(name=name, n=n, k=k, row_bytes=row_bytes, weights=[w0] + [w0.clone() for _ in range(copies - 1)],  # copies only defeat the L2
              dense=dense, w_ref=dequantize_ref(w0, fmt, k))  # w_ref: [N, K] fp32
    x1 = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    st["m1_error"] = check(x1, w0, fmt, k, QuantTuning())
    st["m1_s"] = time_calls([lambda w=w: quant_matmul(x1, w, fmt, k) for w in st["weights"]], device, ROWS_AB_REP_MS)
    return st


def rows_ab_row(st: dict, m: int, args) -> dict:
    """--rows-ab at one projection and M: bf16 F.linear, then each route checked against the reference and timed."""
    device, fmt, n, k, weights = args.device, "Q4_K", st["n"], st["k"], st["weights"]
    rec = dict(format=fmt, projection=st["name"], n=n, k=k, m=m, copies=len(weights), m1_s=st["m1_s"], m1_error=st["m1_error"],
               quant_bytes=n * st["row_bytes"] + m * k * 2 + m * n * 2, bf16_bytes=n * k * 2 + m * k * 2 + m * n * 2)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    ref = x.float() @ st["w_ref"].t()  # [M, N] fp32
    rec["bf16_s"] = time_calls([lambda w=w: F.linear(x, w) for w in st["dense"]], device, ROWS_AB_REP_MS)
    rec["bf16_roofline_frac"] = rec["bf16_bytes"] / args.bandwidth / rec["bf16_s"]
    grid = Q4K_ROWS_GRID[: 1 if args.toy else None]
    if m == 1:  # the decode GEMV's routes (the default first)
        routes = [("words", None, QuantTuning(q4k_gemv_route="words")), ("bytes", None, QuantTuning(q4k_gemv_route="bytes"))]
        routes += dp4a_routes(Q4K_DP4A_GRID[: 2 if args.toy else None], n, k)  # (rows_q4k at M == 1 lost: quant_mma_ab.json)
    else:
        routes = [("generic", None, QuantTuning()), ("tiled", None, QuantTuning(q4k_rows_route="tiled"))] + q4k_routes(grid, n, k, m)
        routes += mmq_routes(Q4K_MMQ_GRID[: 2 if args.toy else None], n, k, m)
    routes += mma_routes(Q4K_MMA_GRID[: 2 if args.toy or m == 1 else None], n, k, m)
    timings = []
    for route, cfg, tuning in routes:
        label = dict(route=route) | ({"config": cfg} if cfg else {})
        try:
            y = quant_matmul(x, weights[0], fmt, k, out_dtype=torch.float32, tuning=tuning)
            err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            if not err <= 1e-2:  # bf16 x (rows_q4k and tiled: weights rounded to bf16): ~2^-9; a wrong kernel is far off
                timings.append(dict(label, error=err, failed="differs from the reference"))
                continue
            s = time_calls([lambda w=w, t=tuning: quant_matmul(x, w, fmt, k, tuning=t) for w in weights], device, ROWS_AB_REP_MS)
        except Exception as e:  # a configuration that does not compile or launch: recorded, not fatal
            timings.append(dict(label, failed=f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        timings.append(dict(label, error=err, s=s, roofline_frac=rec["quant_bytes"] / args.bandwidth / s,
                            vs_m1=s / st["m1_s"], vs_bf16=s / rec["bf16_s"]))
    ok = [t for t in timings if "s" in t]
    rec["routes"] = timings
    rec["best"] = min(ok, key=lambda t: t["s"]) if ok else None
    generic = next((t for t in ok if t["route"] == ("words" if m == 1 else "generic")), None)  # the default route
    if rec["best"] and generic:
        rec["best_speedup_vs_generic"] = generic["s"] / rec["best"]["s"]
    us = {t["route"]: round(t["s"] * 1e6, 1) if "s" in t else t["failed"] for t in timings}
    print(json.dumps(dict(projection=st["name"], m=m, m1_us=round(st["m1_s"] * 1e6, 1), bf16_us=round(rec["bf16_s"] * 1e6, 1), **us)),
          file=sys.stderr, flush=True)
    return rec


def rows_ab(shapes: dict, names: list[str], args) -> None:
    """--rows-ab: M = 32 (the verify width of the target) at every projection first, then the other M; rows
    past --time-limit are written as skipped. The JSON is rewritten after every row."""
    deadline = time.monotonic() + args.time_limit
    setups, results = {}, []
    want = [int(v) for v in args.ms.split(",")] if args.ms else list(ROWS_AB_M)
    for ms in ((32,), (1,), tuple(m for m in want if m not in (1, 32))):
        ms = tuple(m for m in ms if m in want)
        for name in names:
            for m in ms:
                if time.monotonic() > deadline:
                    n, k = shapes[name]
                    results.append(dict(format="Q4_K", projection=name, n=n, k=k, m=m, skipped=f"past --time-limit {args.time_limit} s"))
                    continue
                if name not in setups:
                    setups[name] = rows_ab_setup(name, *shapes[name], args)
                results.append(rows_ab_row(setups[name], m, args))
                results.sort(key=lambda r: (names.index(r["projection"]), r["m"]))
                write(args.out, results, args)
    write(args.out, results, args)


def tables(results: list[dict]) -> tuple[list, list]:
    """The best configuration per (format, N, K) as QuantTuning table entries (GEMV at M == 1; rows at
    M = 32): [format, N, K, {GemvConfig / RowsConfig fields}], i.e. (fmt, n, k, GemvConfig(**fields))."""
    gemv, rows = [], []
    for r in results:
        best = r.get("best")
        if not best or best.get("config", "default") == "default" or "route" in best:  # --rows-ab records name routes
            continue
        if r["m"] == 1:
            gemv.append([r["format"], r["n"], r["k"], best["config"]])
        elif r["m"] == 32:
            rows.append([r["format"], r["n"], r["k"], best["config"]])
    return gemv, rows


def write(path: str, results: list[dict], args) -> None:
    gemv, rows_t = tables(results)
    doc = dict(device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu", torch=torch.__version__,
               bandwidth=args.bandwidth, toy=args.toy, command=" ".join(sys.argv), results=results,
               best_gemv_table=gemv, best_rows_table=rows_t)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated GGUF types (default: all 12)")
    p.add_argument("--projections", default=None, help=f"comma-separated names of {', '.join(PROJECTIONS)}")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values")
    p.add_argument("--configs", action="store_true", help="also time a grid of launch configurations (--toy: its first 3)")
    p.add_argument("--q4k-ab", action="store_true", help="Q4_K at M == 1: the word-wide GEMV's configurations against the byte-wise kernel")
    p.add_argument("--rows-ab", action="store_true", help="Q4_K at M in 2..64: generic rows kernel vs rows_q4k vs tiled vs bf16 (--formats, --rows ignored)")
    p.add_argument("--ms", default=None, help=f"--rows-ab: comma-separated M values (default {','.join(map(str, ROWS_AB_M))})")
    p.add_argument("--time-limit", type=float, default=170.0, help="--rows-ab: seconds after which the remaining rows are skipped")
    p.add_argument("--bandwidth", type=float, default=4.2e12, help="bytes/s of the roofline (H200: 4.2e12)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--toy", action="store_true", help="toy shapes (checks the script; CPU)")
    args = p.parse_args(argv)
    formats = args.formats.split(",")
    for fmt in formats:
        if fmt not in FORMATS:
            p.error(f"--formats: unknown GGUF type {fmt!r} (known: {', '.join(FORMATS)})")
    shapes = TOY if args.toy else PROJECTIONS
    names = args.projections.split(",") if args.projections else list(shapes)
    for name in names:
        if name not in shapes:
            p.error(f"--projections: unknown name {name!r} (known: {', '.join(shapes)})")
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows: expected comma-separated integers, got {args.rows!r}")
    if any(r < 1 for r in rows):
        p.error("--rows: every M must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device (use --device cpu --toy)")
    results = []
    if args.rows_ab:
        rows_ab(shapes, names, args)
        return 0
    for fmt in formats:
        for name in names:
            n, k = shapes[name]
            results += bench_shape(fmt, name, n, k, rows, args, args.device)
            write(args.out, results, args)  # after every shape: a run cut off keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
