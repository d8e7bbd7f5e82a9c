"""linear_fused (kernels/linear/fused.py) against linear_fused_ref, run under TRITON_INTERPRET=1 in a
subprocess by tests/kernels/linear/test_linear.py. Prints one JSON line: per case, the max abs error and
the largest reference magnitude."""

from __future__ import annotations

import json
import sys

import torch

# (M, N, K, norm, unit_offset, bias, residual, swiglu): decode rows, verify batches over one
# 16-row tile, ragged K / N tails, every prologue and epilogue alone and together
CASES = [
    (1, 40, 96, True, False, False, True, False),
    (3, 48, 300, True, True, True, False, False),
    (20, 32, 64, False, False, False, True, True),
    (1, 24, 512, True, False, False, False, True),
    (1, 33, 257, False, False, True, True, False),
    (17, 50, 130, True, True, False, True, False),
]


def main(dtype_name: str) -> None:
    from treeflash.kernels.linear.fused import LinearConfig, linear_fused, linear_fused_ref

    fma = LinearConfig(1, 16, 64, 4, 2, fma=True)

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    out = {}
    for m, n, k, norm, unit, bias, res, swiglu in CASES:
        x = torch.randn(m, k).to(dtype)
        w = (torch.randn(n * (2 if swiglu else 1), k) / k**0.5).to(dtype)
        nw = torch.randn(k).to(dtype) if norm else None
        b = torch.randn(w.shape[0]).to(dtype) if bias else None
        r = torch.randn(m, n).to(dtype) if res else None
        y = linear_fused(x, w, b, nw, 1e-6, unit, r, swiglu)
        ref = linear_fused_ref(x, w, b, nw, 1e-6, unit, r, swiglu)
        assert y.shape == ref.shape and y.dtype == ref.dtype
        key = f"m{m}_n{n}_k{k}_norm{int(norm)}{int(unit)}_bias{int(bias)}_res{int(res)}_swiglu{int(swiglu)}"
        out[key] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()]
        if m == 1:  # the CUDA-core GEMV
            y = linear_fused(x, w, b, nw, 1e-6, unit, r, swiglu, config=fma)
            out[key + "_fma"] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()]
    # through tl.dot with one configuration, a row's result does not depend on the rows batched with
    # it (the default one-row config is the CUDA-core kernel: another summation order). Small integer
    # inputs make every fp32 partial sum exact: the interpreter's tl.dot is numpy's BLAS, whose
    # summation order for a tile may differ between CPUs and memory layouts (9.5e-6 apart on one
    # machine with Gaussian inputs), so only a row mixed with others or misplaced can fail this
    x = torch.randint(-3, 4, (16, 200)).to(dtype)
    w = torch.randint(-3, 4, (64, 200)).to(dtype)
    dot = LinearConfig(16, 32, 128, 4, 3)
    full = linear_fused(x, w, config=dot)
    one = torch.cat([linear_fused(x[i : i + 1], w, config=dot) for i in range(16)])
    out["batch_invariance"] = [(full.float() - one.float()).abs().max().item(), 1.0]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
