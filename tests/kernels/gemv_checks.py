"""gemv (kernels/gemv.py) against gemv_reference, run under TRITON_INTERPRET=1 in a subprocess by
tests/kernels/test_gemv.py. Prints one JSON line: per case, the max abs error, the largest
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
]


def main(dtype_name: str) -> None:
    from treeflash.kernels.gemv import GemvConfig, gemv, gemv_reference

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
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
    main(sys.argv[1])
