"""What a new shape costs SDPA on the GPU, per backend: the first call of each new
(queries, keys) shape, then the steady time, for cuDNN, flash and memory-efficient attention, at the
8B shape's heads (32 of 128) and SmolLM2's (9 of 64). cuDNN builds an execution plan per new shape.
The H200 figures (bench/results/sdpa_plan.txt) set kv/attention_cache.CUDNN_SDPA_MIN. GPU only.

    python -m bench.sdpa_plan --out sdpa_plan.json
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEV = "cuda"


def steady(fn, n=5):
    fn()
    torch.cuda.synchronize()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - s) / n * 1e3


def first_calls():
    """New lengths one after another (a prompt's pass): first and second call, with and without cuDNN."""
    def first(n, backends, mask):
        q = torch.randn(1, 9, n, 64, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(1, 9, n + 16, 64, device=DEV, dtype=torch.bfloat16)
        m = torch.ones(n, n + 16, dtype=torch.bool, device=DEV).tril(16) if mask else None
        out = []
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with sdpa_kernel(backends):
                F.scaled_dot_product_attention(q, k, k, attn_mask=m)
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t) * 1e3)
        return out

    rows = []
    every = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    no_cudnn = every[1:]
    for mask in (True, False):
        for name, b in (("default (cuDNN first)", every), ("no cuDNN", no_cudnn)):
            r = [first(n, b, mask) for n in (101, 117, 133, 149, 165, 181)]
            print(f"mask={mask} {name}: first call ms {[round(a, 2) for a, _ in r]} second {[round(s, 2) for _, s in r]}")
            rows.append({"mask": mask, "backends": name, "queries": [101, 117, 133, 149, 165, 181],
                         "first_ms": [a for a, _ in r], "second_ms": [b for _, b in r]})
    return rows


def per_backend():
    rows = []
    for heads, dim in ((32, 128), (9, 64)):
        for nq, nk in ((256, 256), (1024, 1024), (2048, 2048), (4096, 4096), (4096, 8192), (4096, 16384)):
            q = torch.randn(1, heads, nq, dim, device=DEV, dtype=torch.bfloat16)
            k = torch.randn(1, heads, nk, dim, device=DEV, dtype=torch.bfloat16)
            m = torch.ones(nq, nk, dtype=torch.bool, device=DEV).tril(nk - nq)
            kw = dict(is_causal=True) if nq == nk else dict(attn_mask=m)
            out, row = [], {"heads": heads, "head_dim": dim, "queries": nq, "keys": nk}
            for name, b in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION), ("eff", SDPBackend.EFFICIENT_ATTENTION)):
                if name == "flash" and nq != nk:
                    out.append("flash n/a (mask)")
                    continue
                with sdpa_kernel([b]):
                    torch.cuda.synchronize()
                    s = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, k, **kw)
                    torch.cuda.synchronize()
                    f = (time.perf_counter() - s) * 1e3
                    then = steady(lambda: F.scaled_dot_product_attention(q, k, k, **kw))
                    out.append(f"{name} first {f:.1f} then {then:.3f} ms")
                    row[name] = {"first_ms": f, "steady_ms": then}
            print(f"H{heads} D{dim} {nq}x{nk}: " + " | ".join(out))
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="write the measurements as JSON here")
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "first_calls": first_calls(), "per_backend": per_backend()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
