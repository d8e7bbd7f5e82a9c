"""What a new shape costs SDPA on the GPU, per backend (stop 20): the first call of each new
(queries, keys) shape, then the steady time, for cuDNN, flash and memory-efficient attention, at the
8B shape's heads (32 of 128) and SmolLM2's (9 of 64). cuDNN builds an execution plan per new shape.
The H200 figures are in bench/results/s20/sdpa_plan.txt; they set kv/attention_cache.CUDNN_SDPA_MIN.

    python bench/sdpa_plan.py
"""

import time

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

    every = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    no_cudnn = every[1:]
    for mask in (True, False):
        for name, b in (("default (cuDNN first)", every), ("no cuDNN", no_cudnn)):
            r = [first(n, b, mask) for n in (101, 117, 133, 149, 165, 181)]
            print(f"mask={mask} {name}: first call ms {[round(a, 2) for a, _ in r]} second {[round(s, 2) for _, s in r]}")


def per_backend():
    for heads, dim in ((32, 128), (9, 64)):
        for nq, nk in ((256, 256), (1024, 1024), (2048, 2048), (4096, 4096), (4096, 8192), (4096, 16384)):
            q = torch.randn(1, heads, nq, dim, device=DEV, dtype=torch.bfloat16)
            k = torch.randn(1, heads, nk, dim, device=DEV, dtype=torch.bfloat16)
            m = torch.ones(nq, nk, dtype=torch.bool, device=DEV).tril(nk - nq)
            kw = dict(is_causal=True) if nq == nk else dict(attn_mask=m)
            out = []
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
                    out.append(f"{name} first {f:.1f} then {steady(lambda: F.scaled_dot_product_attention(q, k, k, **kw)):.3f} ms")
            print(f"H{heads} D{dim} {nq}x{nk}: " + " | ".join(out))


if __name__ == "__main__":
    first_calls()
    per_backend()
