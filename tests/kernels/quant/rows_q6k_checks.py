"""rows_q6k (the small-M Q6_K kernel) against its oracles, run under TRITON_INTERPRET=1 in a subprocess by
tests/kernels/quant/test_rows_q6k.py.

`python -m tests.kernels.quant.rows_q6k_checks` prints one JSON line: per case, "contract" (max abs error
against rows_q6k_ref, which rounds the weight to x's dtype as the kernel does), "excess" (the largest
amount by which |y - x @ dequantize_ref^T| exceeds that rounding's bound u |x| @ |w|^T, elementwise;
<= 0 within it), "scale" (the largest reference magnitude), "split" (over K) and "same" (a second
call bitwise equal).
"""

from __future__ import annotations

import json

import torch

# N = 100: a ragged tail of BLOCK_N 64; K = 1024: 4 super-blocks, so the default splits over K by 4
N, K = 100, 1024
MS = (1, 2, 5, 33)  # M == 1 padded to 16 rows; M = 33 one tile of x (BLOCK_M 64)
CONFIGS = (("default", {}), ("nosplit", {"min_programs": 1}))
# fp32 x keeps the weight fp32 (IEEE fp32 dot); fp16 x runs the native-dtype dot (the interpreter's bf16 dot is wrong)
DTYPES = {"float32": torch.float32, "float16": torch.float16}
UNIT = {torch.float32: 0.0, torch.float16: 2.0**-11}  # unit roundoff of the weight's rounding to x's dtype


def case_names() -> list[str]:
    """The cases main() prints, in its order."""
    return [f"q6k_{name}_m{m}_{dt}" for name, _ in CONFIGS for m in MS for dt in DTYPES]


def main() -> None:
    from treeflash.kernels.quant import dequantize_ref
    from treeflash.kernels.quant.config import Q4kRowsConfig, split_for
    from treeflash.kernels.quant.rows_q4k import block_m_for
    from treeflash.kernels.quant.rows_q6k import rows_q6k, rows_q6k_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    gen = torch.Generator().manual_seed(7)
    blocks = random_blocks("Q6_K", N, K, gen)
    w = dequantize_ref(blocks, "Q6_K", K)  # [N, K] fp32
    out = {}
    for name, fields in CONFIGS:
        cfg = Q4kRowsConfig(**fields)
        for m in MS:
            for dt_name, dt in DTYPES.items():
                x = torch.randn(m, K, generator=gen).to(dt)

                def run():
                    return rows_q6k(x, blocks, K, torch.empty(m, N, dtype=torch.float32), cfg, dt == torch.float32)

                y = run()
                programs = -(-N // cfg.block_n) * -(-m // block_m_for(m, cfg))
                split = split_for(K // 256, programs, cfg.min_programs)
                ref = x.float() @ w.t()
                bound = UNIT[dt] * (x.float().abs() @ w.abs().t())  # [M, N]: u |x| |w|, per output
                out[f"q6k_{name}_m{m}_{dt_name}"] = dict(
                    contract=(y - rows_q6k_ref(x, blocks, K, torch.float32)).abs().max().item(),
                    excess=((y - ref).abs() - bound).max().item(), scale=ref.abs().max().item(),
                    split=split, same=split == 1 or torch.equal(y, run()))
    assert list(out) == case_names()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
