"""The quant kernels (GEMV, small-M tiles, large-M dequantized tiles, the dequantizer) equal
dequantize_ref + an fp32 matmul through the Triton interpreter on the CPU, for every format with a
kernel: fp32 x within fp32 accumulation error (q is exact, the scale applied per group), bf16 /
fp16 x likewise (both are exact in fp32), an output rounded to bf16 within one bf16 ulp (the
interpreter's casts truncate); the
dequantizer bit for bit; repeated calls bitwise equal (a fixed reduction order per row)."""

import functools

import pytest

from tests.kernels.interpret import run_module
from treeflash.kernels.quant import FORMATS, has_kernel
from treeflash.kernels.quant.matmul import KERNEL_FORMATS

# the interpreter run covers the formats in two subprocesses (the CPU is shared: keep it to ~2 min)
HALVES = (tuple(list(FORMATS)[:6]), tuple(list(FORMATS)[6:]))
FP32_REL = 2e-6  # of max(|reference|): K <= 1024 fp32 products, summed in another order than torch


@functools.cache
def results(half: tuple[str, ...]) -> dict:
    return run_module("tests.kernels.quant.kernel_checks", *half, timeout=900)


def test_every_format_has_a_kernel():
    assert KERNEL_FORMATS == set(FORMATS) and all(has_kernel(f) for f in FORMATS)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kernels_match_reference(fmt):
    res = results(next(h for h in HALVES if fmt in h))
    mine = {name: v for name, v in res.items() if name.startswith(fmt + "_")}
    assert len(mine) == 5 + 3 + (4 if fmt == "Q4_K" else 0), sorted(mine)  # Q4_K: its four M == 1 kernels
    assert mine.pop(f"{fmt}_dequantize_bits_differ") == 0
    for name, (err, scale, same) in mine.items():
        rel = 2**-7 if name.endswith("bf16_out") else FP32_REL
        assert err <= rel * scale, (name, err, scale)
        assert same, name
