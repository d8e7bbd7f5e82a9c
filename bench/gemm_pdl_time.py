"""The verify rows' GEMM (kernels/gemm_pdl.py, PDL) against cuBLAS, inside CUDA graphs, at the
SmolLM2-135M shapes a folded verify layer runs (q/k/v 960 x 576, o 576 x 576 added into the stream,
gate/up 3072 x 576, down 576 x 1536 added into the stream), 30 layers of distinct random weights
(130 MB: read from HBM, as in the real step), each graph replayed back to back.

Per variant: GPU ms per replay and us per GEMM. Variants: cuBLAS (F.linear / addmm_), then the
kernel at each `--blocks` configuration (BLOCK_N,BLOCK_K,num_warps; "default" = gemm_pdl.config),
with and without a PDL SiLU-mul between gate/up and down (the real layer has PDL kernels between
its GEMMs: rotary and attention after q/k/v, SiLU-mul after gate/up).

    python bench/gemm_pdl_time.py --rows 49 --out gemm_pdl_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeflash.kernels import gemm_pdl  # noqa: E402
from treeflash.kernels.activation import silu_mul  # noqa: E402

LAYERS, H, I, QKV = 30, 576, 1536, 960


def chain(weights, s, rows, use_kernel: bool, with_silu: bool):
    def mm(x, w, add_into=None):
        if use_kernel:
            return gemm_pdl.gemm(x, w, add_into)
        return torch.nn.functional.linear(x, w) if add_into is None else add_into.addmm_(x, w.t())

    attn = torch.randn(rows, H, device=s.device, dtype=s.dtype)  # stands in for the attention output

    def run():
        for wq, wo, wgu, wd in weights:
            mm(s, wq)  # q/k/v (rotary and attention would read it)
            mm(attn, wo, add_into=s)
            gu = mm(s, wgu)
            act = silu_mul(gu) if with_silu else gu[:, :I]  # without: a strided view, no launch
            mm(act, wd, add_into=s)
    return run


def timed(run, replays: int) -> float:
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        run()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / replays


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[49, 33, 17])
    p.add_argument("--blocks", nargs="+", default=["default", "16,64,4,1", "16,64,4,9", "32,64,4,3", "16,128,4,3", "16,64,8,3", "16,32,4,3", "32,128,4,1"])
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--out", default="gemm_pdl_time.json")
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    weights = [tuple(torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for n, k in ((QKV, H), (H, H), (2 * I, H), (H, I)))
               for _ in range(LAYERS)]
    report = {"device": torch.cuda.get_device_name(), "layers": LAYERS, "pdl": gemm_pdl.pdl.flag(weights[0][0]), "results": []}
    for rows in args.rows:
        s = torch.randn(rows, H, device=dev, dtype=torch.bfloat16)
        # correctness at this size first: the kernel against cuBLAS on one layer
        x = torch.randn(rows, H, device=dev, dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x, weights[0][0]).float()
        err = float((gemm_pdl.gemm(x, weights[0][0]).float() - ref).abs().max() / ref.abs().max())
        for with_silu in (False, True):
            variants = [("cublas", None)] + [(f"kernel {b}", b) for b in args.blocks]
            for name, blocks in variants:
                if blocks is None or blocks == "default":
                    os.environ.pop(gemm_pdl.BLOCKS_ENV, None)
                else:
                    os.environ[gemm_pdl.BLOCKS_ENV] = blocks
                s0 = s.clone()
                ms = timed(chain(weights, s0, rows, blocks is not None, with_silu), args.replays)
                row = {"rows": rows, "silu_between": with_silu, "variant": name, "ms_per_replay": round(ms, 4),
                       "us_per_gemm": round(1e3 * ms / (4 * LAYERS), 3), "rel_err_vs_cublas": round(err, 5)}
                report["results"].append(row)
                print(f"[gemm] rows {rows:3d} silu {int(with_silu)} {name:>18}: {ms:.4f} ms, {row['us_per_gemm']:.2f} us/GEMM", flush=True)
    os.environ.pop(gemm_pdl.BLOCKS_ENV, None)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
