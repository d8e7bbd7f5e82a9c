"""quant_matmul's small-M Q4_K routes (rows_q4k, and the tiled route) against their oracles, run under
TRITON_INTERPRET=1 in a subprocess by tests/kernels/quant/test_rows_q4k.py.

`python -m tests.kernels.quant.rows_q4k_checks` prints one JSON line: per case, "contract" (max abs error
against rows_q4k_ref, which rounds the weight to x's dtype as the kernel does), "excess" (the largest
amount by which |y - quant_matmul_ref| exceeds that rounding's bound u |x| @ |w|^T, elementwise;
<= 0 within it), "scale" (the largest reference magnitude), "split" (over K) and "same" (a second
call bitwise equal).
"""

from __future__ import annotations

import json

import torch

# N = 100: a ragged tail of every BLOCK_N; K = 1024: 4 super-blocks, so the split over K is 2 or 4
N, K = 100, 1024
MS = (1, 2, 5, 16, 33)  # M == 1: the decode route QuantTuning(q4k_gemv_route="q4k")
# (name, Q4kRowsConfig fields, Ms): the default (BLOCK_N 64, BLOCK_M up to 64: one tile of x up to M = 64)
# at every M, small tiles (BLOCK_M 16: M = 33 takes 3 tiles of x) at two; each with its split over K and without
CONFIGS = (("default", {}, MS), ("nosplit", {"min_programs": 1}, MS),
           ("small", {"block_m": 16, "block_n": 32}, (5, 33)), ("small_nosplit", {"block_m": 16, "block_n": 32, "min_programs": 1}, (5, 33)))
# fp32 x keeps the weight fp32 (IEEE fp32 dot); fp16 x runs the native-dtype dot (the interpreter's bf16 dot is wrong)
DTYPES = {"float32": torch.float32, "float16": torch.float16}
UNIT = {torch.float32: 0.0, torch.float16: 2.0**-11}  # unit roundoff of the weight's rounding to x's dtype


def case_names() -> list[str]:
    """The cases main() prints, in its order."""
    return [f"q4k_{name}_m{m}_{dt}" for name, _, ms in CONFIGS for m in ms for dt in DTYPES] + ["q4k_fp16_out", "tiled_m5_float32"]


def main() -> None:
    from treeflash.kernels.quant import dequantize_ref, quant_matmul
    from treeflash.kernels.quant.config import Q4kRowsConfig, QuantTuning, split_for
    from treeflash.kernels.quant.rows_q4k import block_m_for, rows_q4k_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    gen = torch.Generator().manual_seed(7)
    blocks = random_blocks("Q4_K", N, K, gen)
    w = dequantize_ref(blocks, "Q4_K", K)  # [N, K] fp32
    out = {}

    def case(y, x, split=1, same=True):
        ref = x.float() @ w.t()
        bound = UNIT[x.dtype] * (x.float().abs() @ w.abs().t())  # [M, N]: u |x| |w|, per output
        return dict(contract=(y.float() - rows_q4k_ref(x, blocks, K, torch.float32)).abs().max().item(),
                    excess=((y.float() - ref).abs() - bound).max().item(), scale=ref.abs().max().item(), split=split, same=same)

    for name, fields, ms in CONFIGS:
        cfg = Q4kRowsConfig(**fields)
        tuning = QuantTuning(q4k_rows_route="q4k", q4k_gemv_route="q4k", q4k_rows=cfg)
        for m in ms:
            for dt_name, dt in DTYPES.items():
                x = torch.randn(m, K, generator=gen).to(dt)
                y = quant_matmul(x, blocks, "Q4_K", K, out_dtype=torch.float32, tuning=tuning)
                programs = -(-N // cfg.block_n) * -(-m // block_m_for(m, cfg))
                split = split_for(K // 256, programs, cfg.min_programs)
                same = split == 1 or torch.equal(y, quant_matmul(x, blocks, "Q4_K", K, out_dtype=torch.float32, tuning=tuning))
                out[f"q4k_{name}_m{m}_{dt_name}"] = case(y, x, split, same)
    # the output rounded to x's dtype once (fp16 out: within its rounding of the fp32 result)
    x = torch.randn(5, K, generator=gen).to(torch.float16)
    y = quant_matmul(x, blocks, "Q4_K", K, tuning=QuantTuning(q4k_rows_route="q4k"))
    out["q4k_fp16_out"] = case(y, x, same=y.dtype == torch.float16)
    # the tiled route at small M (the weight dequantized in tiles of 48 rows, then a torch matmul), fp32 x
    x = torch.randn(5, K, generator=gen)
    y = quant_matmul(x, blocks, "Q4_K", K, tuning=QuantTuning(q4k_rows_route="tiled", dequant_rows=48))
    out["tiled_m5_float32"] = case(y, x)
    assert list(out) == case_names()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
