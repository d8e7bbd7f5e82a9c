"""gemv (kernels/linear/gemv.py) against gemv_reference, run under TRITON_INTERPRET=1 in a subprocess by
tests/kernels/linear/test_gemv.py. Prints one JSON line: per case, the max abs error, the largest
reference magnitude, and whether a second call gave bitwise the same result (the tickets reset)."""

from __future__ import annotations

import json
import sys

import torch

# (N, K, bias, config): ragged N and K tails, one split and several (the ticket reduce), bias on both paths
CASES = [
    (40, 96, False, (8, 32, 1, 4)),
    (33, 257, True, (8, 64, 1, 4)),
    (48, 300, False, (16, 32, 3, 4)),
    (50, 512, True, (8, 64, 4, 2)),
    (7, 130, False, (4, 16, 5, 1)),
    (64, 1024, False, None),  # the default configuration
    # a tile wider than K (one masked step), as the SmolLM2 entries of gemv.TUNED take since stop 30
    (24, 576, True, (2, 1024, 1, 4)),
    (20, 1536, False, (4, 2048, 1, 8)),
]


def swiglu_cases(dtype) -> dict:
    """gemv_swiglu against silu_mul(gemv_reference): ragged I and K tails."""
    from treeflash.kernels.linear.gemv import GemvConfig, gemv_swiglu, gemv_swiglu_reference

    out = {}
    for i, k, cfg in [(40, 96, (8, 32, 1, 4)), (33, 257, (4, 64, 1, 2)), (64, 1024, None)]:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(2 * i, k) / k**0.5).to(dtype)
        y = gemv_swiglu(x, w, config=GemvConfig(*cfg) if cfg else None)
        ref = gemv_swiglu_reference(x, w)
        assert y.shape == ref.shape == (1, i) and y.dtype == dtype
        out[f"swiglu_i{i}_k{k}_{cfg}"] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(), True]
    return out


def fold_cases(dtype) -> dict:
    """A folded layer's GEMVs (projection.folded / folded_swiglu): gemv's residual add in the epilogue
    (add_into, in place; split 1 and split-K, a bias) against addmm_'s numerics (fp32 product and add, one
    rounding), and
    gemv_swiglu's folded norm (rows: 1 / rms of x from its own pass) against silu_mul_ref(rows).
    The third field: the stream was updated in place (add) / the second call gave the same (swiglu)."""
    from treeflash.kernels.pointwise.activation import silu_mul_ref
    from treeflash.kernels.linear.gemv import GemvConfig, gemv, gemv_reference, gemv_swiglu

    out = {}
    for n, k, bias, cfg in [(40, 96, False, (8, 32, 1, 4)), (33, 257, True, (8, 64, 1, 2)), (48, 300, False, (16, 32, 3, 4))]:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        s = torch.randn(1, n).to(dtype)
        ref = (s.float() + x.float() @ w.float().t() + (0.0 if b is None else b.float())).to(dtype)
        got = s.clone()
        ptr = got.data_ptr()
        back = gemv(x, w, b, config=GemvConfig(*cfg), add_into=got)
        out[f"add_n{n}_k{k}_{cfg}_bias{bias}"] = [(got.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(),
                                                   bool(back is got and got.data_ptr() == ptr)]
    for i, k, cfg in [(40, 96, (8, 32, 1, 4)), (33, 257, (4, 64, 1, 2)), (64, 1024, None)]:
        x = (3.0 * torch.randn(1, k)).to(dtype)  # rms far from 1: the scale matters
        w = (torch.randn(2 * i, k) / k**0.5).to(dtype)
        config = GemvConfig(*cfg) if cfg else None
        y = gemv_swiglu(x, w, config=config, rows=(x, 1e-6))
        again = gemv_swiglu(x, w, config=config, rows=(x, 1e-6))
        ref = silu_mul_ref(gemv_reference(x, w), (x, 1e-6))
        assert y.shape == ref.shape == (1, i) and y.dtype == dtype
        out[f"swiglu_rows_i{i}_k{k}_{cfg}"] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(),
                                               bool(torch.equal(y, again))]
    return out


def main(dtype_name: str, mode: str = "gemv") -> None:
    from treeflash.kernels.linear.gemv import GemvConfig, gemv, gemv_reference

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    if mode in ("swiglu", "fold"):
        print(json.dumps({"swiglu": swiglu_cases, "fold": fold_cases}[mode](dtype)))
        return
    out = {}
    for n, k, bias, cfg in CASES:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        config = GemvConfig(*cfg) if cfg else None
        y = gemv(x, w, b, config=config)
        again = gemv(x[0], w, b, config=config)  # a [K] vector; the second call reuses the reset tickets
        ref = gemv_reference(x, w, b)
        assert y.shape == ref.shape and y.dtype == ref.dtype and again.shape == (n,)
        out[f"n{n}_k{k}_{cfg}"] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(),
                                   bool(torch.equal(y[0], again))]
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
