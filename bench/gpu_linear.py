"""The fused linear kernel (kernels/linear.py) against cuBLAS on one GPU, at the projections of the
Qwen3-8B and Qwen3.5-27B shapes: time per call and weight bytes per second, for 1 row (decode)
and a few verify batch sizes, for a sweep of launch configurations.

    python bench/gpu_linear.py --out bench/results/gpu_linear.json

Each projection is timed three ways (CUDA-graph replay, triton.testing.do_bench_cudagraph, so
launch overhead is not counted but the gap between kernels is), each call on one of several
copies of the weight in turn (>= 256 MB per round, 5x the L2) so every byte comes from memory:
- `cublas`: F.linear alone (what the GEMV itself costs in cuBLAS);
- `unfused`: what the layer ran before the fusion: RMSNorm + F.linear, F.linear + SiLU-mul, or
  F.linear + the residual add (Triton/PyTorch kernels, as in models/layers.py);
- `fused/<config>`: linear_fused with that configuration (prologue and epilogue inside).
The fraction is weight bytes / time / the copy bandwidth measured in the same run (bytes read +
written). Each fused result is first checked against linear_fused_ref.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from treeflash.kernels.activation import silu_mul  # noqa: E402
from treeflash.kernels.linear import LinearConfig, linear_fused, linear_fused_ref  # noqa: E402
from treeflash.kernels.norm import rmsnorm  # noqa: E402

# name: (N, K, kind); kind: norm (RMSNorm before), swiglu (N = 2I rows, SiLU-mul after), res (residual add after)
PROJECTIONS = {
    "8b.qkv": (6144, 4096, "norm"),
    "8b.o": (4096, 4096, "res"),
    "8b.gate_up": (24576, 4096, "swiglu"),
    "8b.down": (4096, 12288, "res"),
    "27b.gdn_in": (16480, 5120, "norm"),
    "27b.gdn_out": (5120, 6144, "res"),
    "27b.attn_qkv": (14336, 5120, "norm"),
    "27b.gate_up": (34816, 5120, "swiglu"),
    "27b.down": (5120, 17408, "res"),
    # SmolLM2-135M, the embedded default (a verify step's GEMMs are latency-bound there: 0.7-3.5 MB each)
    "smol.qkv": (960, 576, "norm"),
    "smol.o": (576, 576, "res"),
    "smol.gate_up": (3072, 576, "swiglu"),
    "smol.down": (576, 1536, "res"),
}

ONE_ROW = [  # (block_m, block_n, block_k, warps, stages, fma)
    (16, 16, 256, 4, 3, False), (16, 16, 512, 4, 3, False), (16, 32, 256, 4, 3, False),
    (16, 32, 256, 8, 4, False), (16, 16, 256, 4, 5, False), (16, 64, 128, 4, 3, False),
    (1, 16, 256, 4, 3, True), (1, 32, 128, 4, 3, True), (1, 8, 512, 4, 3, True),
    (1, 16, 512, 8, 3, True), (1, 32, 256, 8, 3, True), (1, 64, 64, 4, 4, True),
]
MANY_ROWS = [(0, 16, 256, 4, 3, False), (0, 32, 128, 4, 3, False), (0, 64, 64, 4, 3, False),
             # narrow tiles (more programs over a small weight), short K steps, deeper pipelines
             (0, 16, 64, 4, 4, False), (0, 16, 128, 4, 3, False), (0, 16, 64, 2, 4, False), (0, 32, 64, 4, 4, False),
             (0, 16, 32, 4, 6, False), (0, 32, 256, 8, 2, False), (0, 64, 128, 4, 3, False), (0, 16, 128, 8, 3, False)]


def cfg_name(c: tuple) -> str:
    return f"{'fma' if c[5] else 'dot'}_m{c[0]}_n{c[1]}_k{c[2]}_w{c[3]}_s{c[4]}"


def copy_bandwidth() -> float:
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
    # (at most 1024: SmolLM2's 0.7 MB weights need ~400 copies; with at most 16, as before stop 22, they stayed
    # in the L2 and cuBLAS and Triton timed 25-50% faster than inside a model's step graph)
    copies = max(2, min(1024, -(-256_000_000 // (n * k * 2))))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]


def bench(fn) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=60, return_mode="median") * 1e-3  # seconds


def run_projection(name: str, rows: int, configs: list[tuple], bw: float) -> dict:
    n_w, k, kind = PROJECTIONS[name]
    dev, dt = "cuda", torch.bfloat16
    # enough copies of the weight that one timed call streams >= 256 MB (5x the L2): each copy is
    # read from memory, as a model's layers are, not from the L2 left warm by the previous call
    nbytes = n_w * k * 2
    ws = weight_copies(n_w, k)
    copies = len(ws)
    w = ws[0]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    nw = torch.rand(k, device=dev, dtype=dt) + 0.5
    n_out = n_w // 2 if kind == "swiglu" else n_w
    res = torch.randn(rows, n_out, device=dev, dtype=dt)
    kw = dict(norm_weight=nw if kind == "norm" else None, residual=res if kind == "res" else None, swiglu=kind == "swiglu")
    out: dict = {"rows": rows, "N": n_w, "K": k, "kind": kind, "weight_mb": nbytes / 1e6, "weight_copies": copies}

    def unfused(w):
        if kind == "norm":
            return F.linear(rmsnorm(x, nw, 1e-6)[0], w)
        if kind == "swiglu":
            return silu_mul(F.linear(x, w))
        return F.linear(x, w) + res

    def over_copies(fn):
        def run():
            for wi in ws:
                fn(wi)
        return run

    for label, fn in (("cublas", lambda wi: F.linear(x, wi)), ("unfused", unfused)):
        t = bench(over_copies(fn)) / copies
        out[label] = {"us": t * 1e6, "fraction": nbytes / t / bw}
    ref = linear_fused_ref(x, w, **kw).float()
    scale = ref.abs().max().item()
    for c in configs:
        cfg = LinearConfig(c[0] or (16 if rows <= 16 else 32 if rows <= 32 else 64), *c[1:])
        key = "fused/" + cfg_name((cfg.block_m, *c[1:]))
        try:
            y = linear_fused(x, w, **kw, config=cfg)
            err = (y.float() - ref).abs().max().item() / scale
            t = bench(over_copies(lambda wi: linear_fused(x, wi, **kw, config=cfg))) / copies
            out[key] = {"us": t * 1e6, "fraction": nbytes / t / bw, "rel_err": err}
        except Exception as e:  # record and go on: one config must not end the sweep
            out[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    del ws, w, x
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--projections", default=",".join(PROJECTIONS), help="comma-separated names (default: all)")
    p.add_argument("--rows", default="1,32", help="row counts (1 = decode)")
    p.add_argument("--out", default="bench/results/gpu_linear.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_linear.py needs a CUDA GPU")
    bw = copy_bandwidth()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_gb_s": bw / 1e9, "runs": []}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    t0 = time.perf_counter()
    for name in args.projections.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            r = run_projection(name, rows, ONE_ROW if rows == 1 else MANY_ROWS, bw)
            r["name"] = name
            result["runs"].append(r)
            fused = {k: v for k, v in r.items() if k.startswith("fused/") and "us" in v}
            best = min(fused, key=lambda k: fused[k]["us"]) if fused else None
            line = f"{name:14s} M={rows:3d}: cublas {r['cublas']['us']:7.1f} us ({r['cublas']['fraction']:.0%})  unfused {r['unfused']['us']:7.1f} us"
            if best:
                line += f"  best fused {fused[best]['us']:7.1f} us ({fused[best]['fraction']:.0%}) {best[6:]} err {fused[best]['rel_err']:.1e}"
            print(line + f"  [{time.perf_counter() - t0:.0f}s]", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
