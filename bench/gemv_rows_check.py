"""gemv's rows mode on the GPU: bit for bit the one-row calls, and its time against cuBLAS.

    python bench/gemv_rows_check.py --rows 2 16 32 --groups 1 4 8 32 --out gemv_rows_check.json

For every tuned SmolLM2 projection (gemv.TUNED / TUNED_SWIGLU entries of the 135M shape) and every
row count M: x [M, K] bf16 through rows mode at each group size must equal, bit for bit, the M
one-row calls the decode step makes (the interpreter tests check the same on the CPU with numpy's
arithmetic; this checks the GPU's, FMA contraction included). Then the time of one call (CUDA
events, median of 200 after warm-up, weights warm in L2 as in a verify graph) for rows mode at
each group, against cuBLAS's F.linear (and silu_mul after it for gate_up).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

SMOL = {"qkv": (960, 576), "o": (576, 576), "down": (576, 1536)}
SMOL_SWIGLU = {"gate_up": (3072, 576)}


def _time(fn, reps: int = 200) -> float:
    for _ in range(10):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(starts, ends):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends)) * 1e3  # us


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[2, 16, 32])
    p.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 32])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs CUDA (on the CPU the interpreter tests check rows mode: tests/kernels/test_gemv.py)")
    from treeflash.kernels import gemv as g
    from treeflash.kernels.activation import silu_mul

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    report = {"device": torch.cuda.get_device_name(0), "rows": args.rows, "groups": args.groups, "cases": []}
    ok = True
    for name, (n, k) in {**SMOL, **SMOL_SWIGLU}.items():
        swiglu = name in SMOL_SWIGLU
        w = (torch.randn(n, k, device=dev) / k**0.5).to(dt)
        for m in args.rows:
            x = torch.randn(m, k, device=dev).to(dt)
            if swiglu:
                one = torch.cat([g.gemv_swiglu(x[i : i + 1], w) for i in range(m)])
                cublas = _time(lambda: silu_mul(F.linear(x, w)))
            else:
                one = torch.cat([g.gemv(x[i : i + 1], w) for i in range(m)])
                cublas = _time(lambda: F.linear(x, w))
            row = {"projection": name, "shape": [n, k], "m": m, "cublas_us": round(cublas, 2), "groups": {}}
            for group in args.groups:
                g.ROWS_GROUP = group
                call = (lambda: g.gemv_swiglu(x, w)) if swiglu else (lambda: g.gemv(x, w))
                same = bool(torch.equal(call(), one))
                ok &= same
                row["groups"][group] = {"identical_to_one_row_calls": same, "us": round(_time(call), 2)}
            report["cases"].append(row)
            print(f"[rows] {name:>8} m={m:>2}: cuBLAS {row['cublas_us']:6.2f} us | "
                  + " | ".join(f"g{gr} {v['us']:6.2f} us {'=' if v['identical_to_one_row_calls'] else 'DIFFERENT'}"
                               for gr, v in row["groups"].items()), flush=True)
    report["all_identical"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("ROWS MODE IDENTICAL" if ok else "ROWS MODE DIFFERS FROM THE ONE-ROW CALLS")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
