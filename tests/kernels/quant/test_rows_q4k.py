"""rows_q4k (kernels/quant/rows_q4k.py), the small-M Q4_K kernel, through the Triton interpreter: equal to
its contract rows_q4k_ref (dequantize_ref rounded to x's dtype, an fp32 matmul) within fp32 accumulation
error, and to quant_matmul_ref within that rounding's bound, at M = 2, 5, 16, 33 on N = 100 (a ragged tail
of every BLOCK_N), with the split over K and without, bitwise repeatable; the tiled route too. And the
route and its configuration are checked when built."""

import functools

import pytest

from tests.kernels.interpret import run_module
from tests.kernels.quant.rows_q4k_checks import case_names
from treeflash.kernels.quant.config import Q4kRowsConfig, QuantTuning

FP32_REL = 2e-6  # of max(|reference|), as tests/kernels/quant/test_kernels.py: K = 1024 fp32 products in another order
FP16_OUT_REL = 2.0**-10  # an fp16 output: half an ulp of the largest value, and the fp32 error before it


@functools.cache
def results() -> dict:
    return run_module("tests.kernels.quant.rows_q4k_checks", timeout=600)


@pytest.mark.parametrize("name", case_names())
def test_rows_q4k_matches_its_references(name):
    r = results()[name]
    rel = FP16_OUT_REL if name.endswith("fp16_out") else FP32_REL
    assert r["contract"] <= rel * r["scale"], r
    assert r["excess"] <= rel * r["scale"], r
    assert r["same"], r
    if name.startswith("q4k_") and not name.endswith("out"):  # N = 100: 2-12 programs, so a split of 4 over the 4 blocks
        assert r["split"] == (1 if "nosplit" in name else 4), r


def test_the_route_and_config_are_checked():
    assert QuantTuning().q4k_rows_route == "q4k"  # the measured winner at M = 32 (bench/results/quant_mma_ab.json)
    with pytest.raises(ValueError, match="q4k_rows_route"):
        QuantTuning(q4k_rows_route="fast")
    for bad, field in (({"block_m": 8}, "block_m"), ({"block_n": 48}, "block_n"), ({"num_stages": 0}, "num_stages"),
                       ({"min_programs": 0}, "min_programs"), ({"num_warps": 3}, "num_warps")):
        with pytest.raises(ValueError, match=field):
            Q4kRowsConfig(**bad)
