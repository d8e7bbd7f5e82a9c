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
    # a tile wider than K (one masked step), as the SmolLM2 entries of gemv.TUNED take since stop 30
    (24, 576, True, (2, 1024, 1, 4)),
    (20, 1536, False, (4, 2048, 1, 8)),
]


def norm_cases(dtype) -> dict:
    """gemv_add_norm against its reference: normed output and stream, split 1 and split-K, unit offset."""
    from treeflash.kernels.gemv import GemvConfig, gemv_add_norm, gemv_add_norm_reference

    out = {}
    for n, k, cfg, unit in [(40, 96, (8, 32, 1, 4), False), (33, 257, (8, 64, 1, 2), True), (48, 300, (16, 32, 3, 4), False)]:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        r = torch.randn(1, n).to(dtype)
        nw = (torch.rand(n) + 0.5).to(dtype)
        normed, stream = gemv_add_norm(x, w, r, nw, 1e-6, unit, config=GemvConfig(*cfg))
        normed2, _ = gemv_add_norm(x, w, r, nw, 1e-6, unit, config=GemvConfig(*cfg))  # the ticket was reset
        ref_n, ref_s = gemv_add_norm_reference(x, w, r, nw, 1e-6, unit)
        assert normed.shape == ref_n.shape == stream.shape == (1, n) and normed.dtype == dtype
        out[f"norm_n{n}_k{k}_{cfg}_unit{unit}"] = [
            max((normed.float() - ref_n.float()).abs().max().item(), (stream.float() - ref_s.float()).abs().max().item()),
            max(ref_n.float().abs().max().item(), ref_s.float().abs().max().item()), bool(torch.equal(normed, normed2))]
    return out


def swiglu_cases(dtype) -> dict:
    """gemv_swiglu against silu_mul(gemv_reference): ragged I and K tails."""
    from treeflash.kernels.gemv import GemvConfig, gemv_swiglu, gemv_swiglu_reference

    out = {}
    for i, k, cfg in [(40, 96, (8, 32, 1, 4)), (33, 257, (4, 64, 1, 2)), (64, 1024, None)]:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(2 * i, k) / k**0.5).to(dtype)
        y = gemv_swiglu(x, w, config=GemvConfig(*cfg) if cfg else None)
        ref = gemv_swiglu_reference(x, w)
        assert y.shape == ref.shape == (1, i) and y.dtype == dtype
        out[f"swiglu_i{i}_k{k}_{cfg}"] = [(y.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(), True]
    return out


def norm_in_cases(dtype) -> dict:
    """The norm prologue (gemv_norm_in, gemv_swiglu(norm_in=...)) against norm-then-project references:
    output and stream, ragged N and K, a bias, unit offset, several n-blocks (one writes the stream)."""
    from treeflash.kernels.gemv import GemvConfig, gemv_norm_in, gemv_norm_in_reference, gemv_swiglu, gemv_swiglu_reference
    from treeflash.kernels.norm import rmsnorm, rmsnorm_ref

    out = {}
    for n, k, cfg, unit, bias in [(40, 96, (8, 32, 1, 4), False, False), (33, 257, (8, 64, 1, 2), True, True),
                                  (64, 1024, (16, 256, 1, 4), False, False)]:
        x, r = torch.randn(1, k).to(dtype), torch.randn(1, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        nw = (torch.rand(k) + 0.5).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        y, stream = gemv_norm_in(x, w, r, nw, 1e-6, unit, bias=b, config=GemvConfig(*cfg))
        ref_y, ref_s = gemv_norm_in_reference(x, w, r, nw, 1e-6, unit, bias=b)
        assert y.shape == ref_y.shape == (1, n) and stream.shape == ref_s.shape == (1, k) and y.dtype == dtype
        # the stream is the norm kernel's, bit for bit (the kernel, not rmsnorm_ref: the interpreter's
        # fp32 -> bf16 cast truncates where torch rounds to nearest)
        kernel_s = rmsnorm(x, nw, 1e-6, unit, r)[1]
        same = torch.equal(stream, kernel_s)
        out[f"norm_in_n{n}_k{k}_{cfg}_unit{unit}_bias{bias}"] = [
            (y.float() - ref_y.float()).abs().max().item(), ref_y.float().abs().max().item(), bool(same)]
        i = n  # gate_up [2I, K]
        gu = (torch.randn(2 * i, k) / k**0.5).to(dtype)
        sy, sstream = gemv_swiglu(x, gu, config=GemvConfig(cfg[0], cfg[1], 1, cfg[3]), norm_in=(r, nw, 1e-6, unit))
        # against the unfused kernels (norm, then gemv_swiglu) in bf16: the interpreter's truncating
        # casts then fall on both sides; fp32 against the plain reference
        normed = rmsnorm(x, nw, 1e-6, unit, r)[0] if dtype == torch.bfloat16 else rmsnorm_ref(x, nw, 1e-6, unit, r)[0]
        ref = gemv_swiglu(normed, gu, config=GemvConfig(cfg[0], cfg[1], 1, cfg[3])) if dtype == torch.bfloat16 else gemv_swiglu_reference(normed, gu)
        out[f"swiglu_norm_in_i{i}_k{k}_{cfg}_unit{unit}"] = [
            (sy.float() - ref.float()).abs().max().item(), ref.float().abs().max().item(), bool(torch.equal(sstream, kernel_s))]
    return out


def rows_cases(dtype) -> dict:
    """Rows mode (gemv and gemv_swiglu on [M, K]): every row bit for bit the one-row call's, and
    within rounding of the reference, at 3, 8 and 1 rows a program (5 rows in groups of 3: a ragged
    last group; 16 rows in two groups of 8); a bias; ragged N, K and I tails."""
    from treeflash.kernels import gemv as gemv_mod
    from treeflash.kernels.gemv import GemvConfig, gemv, gemv_reference, gemv_swiglu, gemv_swiglu_reference

    out = {}
    for m, n, k, bias, cfg, group in [(5, 40, 96, True, (8, 32, 1, 4), 3), (16, 33, 257, False, (4, 64, 1, 2), 8),
                                      (3, 64, 1024, False, None, 1)]:
        x = torch.randn(m, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        config = GemvConfig(*cfg) if cfg else None
        ones = torch.cat([gemv(x[i:i + 1], w, b, config=config) for i in range(m)])
        ref = gemv_reference(x, w, b)
        i = n  # gate_up [2I, K]
        gu = (torch.randn(2 * i, k) / k**0.5).to(dtype)
        scfg = GemvConfig(cfg[0], cfg[1], 1, cfg[3]) if cfg else None
        sones = torch.cat([gemv_swiglu(x[j:j + 1], gu, config=scfg) for j in range(m)])
        sref = gemv_swiglu_reference(x, gu)
        gemv_mod.ROWS_GROUP = group
        y = gemv(x, w, b, config=config)
        sy = gemv_swiglu(x, gu, config=scfg)
        assert y.shape == ref.shape == (m, n) and y.dtype == dtype and sy.shape == sref.shape == (m, i)
        out[f"rows_m{m}_n{n}_k{k}_{cfg}_g{group}"] = [(y.float() - ref.float()).abs().max().item(),
                                                      ref.float().abs().max().item(), bool(torch.equal(y, ones))]
        out[f"rows_swiglu_m{m}_i{i}_k{k}_{cfg}_g{group}"] = [(sy.float() - sref.float()).abs().max().item(),
                                                             sref.float().abs().max().item(), bool(torch.equal(sy, sones))]
    return out


def fold_cases(dtype) -> dict:
    """A folded layer's GEMVs (projection.folded / folded_swiglu): gemv's residual add in the epilogue
    (add_into, in place; split 1 and split-K, a bias) against addmm_'s numerics (gemm_pdl.gemm_ref), and
    gemv_swiglu's folded norm (rows: 1 / rms of x from its own pass) against silu_mul_ref(rows).
    The third field: the stream was updated in place (add) / the second call gave the same (swiglu)."""
    from treeflash.kernels.activation import silu_mul_ref
    from treeflash.kernels.gemm_pdl import gemm_ref
    from treeflash.kernels.gemv import GemvConfig, gemv, gemv_reference, gemv_swiglu

    out = {}
    for n, k, bias, cfg in [(40, 96, False, (8, 32, 1, 4)), (33, 257, True, (8, 64, 1, 2)), (48, 300, False, (16, 32, 3, 4))]:
        x = torch.randn(1, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        b = torch.randn(n).to(dtype) if bias else None
        s = torch.randn(1, n).to(dtype)
        ref = gemm_ref(x, w, s.clone())
        if b is not None:  # gemm_ref has no bias: the bias joins the product before the one rounding
            ref = (s.float() + x.float() @ w.float().t() + b.float()).to(dtype)
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
    from treeflash.kernels.gemv import GemvConfig, gemv, gemv_reference

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    if mode in ("norm", "swiglu", "norm_in", "rows", "fold"):
        print(json.dumps({"norm": norm_cases, "swiglu": swiglu_cases, "norm_in": norm_in_cases, "rows": rows_cases,
                          "fold": fold_cases}[mode](dtype)))
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
