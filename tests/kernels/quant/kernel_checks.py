"""quant_matmul's Triton kernels (kernels/quant/kernels.py) against dequantize_ref + an fp32 matmul,
run under TRITON_INTERPRET=1 in a subprocess by tests/kernels/quant/test_kernels.py.

`python -m tests.kernels.quant.kernel_checks FMT...` prints one JSON line: per case, [max abs error,
largest reference magnitude, deterministic], and per format the dequantize kernel's count of values
that differ bitwise from dequantize_ref.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

# (N, K) per format: N = 100 and 72 leave ragged tails of the default BLOCK_N (16 for the GEMV, 32 for
# the rows kernel), K one to four 256-value blocks or 8-32 of the 32-value blocks; the first-priority
# formats Q4_K and Q8_0 at K = 1024. Small, because the interpreter runs every program in Python.
SHAPES = {"Q4_0": (72, 256), "Q4_1": (100, 256), "Q5_0": (64, 512), "Q5_1": (72, 256), "Q8_0": (64, 1024),
          "IQ4_NL": (100, 256), "Q2_K": (72, 256), "Q3_K": (100, 512), "Q4_K": (100, 1024), "Q5_K": (72, 256),
          "Q6_K": (64, 512), "IQ4_XS": (72, 256)}
# (M, x dtype, checked twice for bitwise equality): the GEMV, the rows kernel at BLOCK_M 16 and 64;
# fp16 is the native-dtype tl.dot (the interpreter's bf16 dot is wrong, so bf16 takes the fp32 dot there)
ROWS = ((1, "float32", True), (1, "bfloat16", False), (3, "float32", False), (16, "float16", False), (33, "bfloat16", True))
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cases(fmt: str) -> dict:
    from treeflash.kernels.quant import FORMATS, dequantize_ref, quant_matmul
    from treeflash.kernels.quant.config import QuantTuning

    # the generic kernels (gemv_kernel, rows_kernel) for every format, and the word-wide Q4_K GEMV: the default
    # Q4_K / Q6_K routes (mma_q4k, rows_q4k, rows_q6k) have tests of their own
    GENERIC = QuantTuning(q4k_gemv_route="words", q4k_rows_route="generic", q6k_rows_route="generic", q6k_gemv_route="bytes",
                          q8_0_gemv_route="generic", q3k_gemv_route="generic")
    from treeflash.kernels.quant.matmul import dequantize
    from treeflash.kernels.quant.synthetic import random_blocks

    f = FORMATS[fmt]
    n, k = SHAPES[fmt]
    assert k % f.block_values == 0
    gen = torch.Generator().manual_seed(list(FORMATS).index(fmt))
    blocks = random_blocks(fmt, n, k, gen)
    w = dequantize_ref(blocks, fmt, k)  # [N, K] fp32
    out = {}
    for m, dt, twice in ROWS:
        x = torch.randn(m, k, generator=gen).to(DTYPES[dt])
        ref = x.float() @ w.t()
        y = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=GENERIC)
        same = torch.equal(y, quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=GENERIC)) if twice else True
        out[f"{fmt}_n{n}_k{k}_m{m}_{dt}"] = [(y - ref).abs().max().item(), ref.abs().max().item(), bool(same)]
    # the output rounded to x's dtype once, and the large-M path (tiles dequantized, torch matmul)
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    y = quant_matmul(x, blocks, fmt, k, tuning=GENERIC)
    assert y.dtype == torch.bfloat16
    out[f"{fmt}_m3_bf16_out"] = [(y.float() - x.float() @ w.t()).abs().max().item(), (x.float() @ w.t()).abs().max().item(), True]
    x = torch.randn(20, k, generator=gen)
    y = quant_matmul(x, blocks, fmt, k, tuning=dataclasses.replace(GENERIC, max_rows=16, dequant_rows=48))
    out[f"{fmt}_m20_tiled"] = [(y - x @ w.t()).abs().max().item(), (x @ w.t()).abs().max().item(), True]
    if fmt == "Q4_K":  # the decode routes: word-wide (no split; x tiled), byte-wise, rows_q4k (x padded to 16 rows)
        from treeflash.kernels.quant.config import Q4kGemvConfig

        x = torch.randn(1, k, generator=gen)
        for name, tuning in (("words_nosplit", QuantTuning(q4k_gemv_route="words", q4k=Q4kGemvConfig(min_programs=1))), ("bytewise", QuantTuning(q4k_gemv_route="bytes")),
                             ("words_xtile", QuantTuning(q4k_gemv_route="words", q4k=Q4kGemvConfig(x_tile=True))),
                             ("rows_q4k", QuantTuning(q4k_gemv_route="q4k"))):
            y = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=tuning)
            out[f"{fmt}_m1_{name}"] = [(y - x @ w.t()).abs().max().item(), (x @ w.t()).abs().max().item(), True]
    wd = dequantize(blocks, fmt, k, torch.empty(n, k))
    out[f"{fmt}_dequantize_bits_differ"] = int((wd.view(torch.int32) != w.view(torch.int32)).sum())
    return out


def main(formats: list[str]) -> None:
    result = {}
    for fmt in formats:
        result.update(cases(fmt))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
