"""rows_gemm (kernels/linear/rows_gemm.py), the batch-invariant small-M linear, through the Triton interpreter
(tests/kernels/linear/rows_gemm_checks.py in a subprocess): equal to rows_gemm_reference at M = 1, 2, 5, 16, 17, 33
on N = 100 (a ragged tail of every BLOCK_N), K with and without a split (a ragged K split 3 ways, an even one split
2 ways), bias + in-place add_into; and the invariance itself: every row of rows_gemm(x [33, K]) bitwise equal to
the same row computed alone, among the first j rows, or at another position of its tile (torch.equal).
fp16 and fp32 run the kernel's own dots; bf16 runs as fp32 dots (the interpreter's bf16 tl.dot is wrong) and the
interpreter rounds its bf16 stores toward zero, so bf16 is held to one bf16 ulp."""

import functools

import pytest
import torch

from tests.kernels.interpret import run_module
from tests.kernels.linear.rows_gemm_checks import case_names
from treeflash.kernels.linear.rows_gemm import (TABLE, RowsGemmConfig, default_config, rows_gemm,
                                                rows_gemm_config, rows_gemm_reference)

# of max(|reference|, 1): fp32, K <= 256 products summed in another order; fp16, one output ulp (2^-10 of the value);
# bf16, one output ulp (2^-7: the interpreter truncates)
REL = {"float32": 2e-6, "float16": 2.0**-10, "bfloat16": 2.0**-7}


@functools.cache
def results() -> dict:
    return run_module("tests.kernels.linear.rows_gemm_checks", timeout=600)


@pytest.mark.parametrize("name", case_names())
def test_rows_gemm_interpreted(name):
    r = results()[name]
    if name.startswith("inv_"):
        assert r["same"], r
        assert r["split"] == {"nosplit": 1, "split3": 3, "split2": 2, "default": 1}[name.split("_")[1]], r
    else:
        assert r["err"] <= REL[r["dtype"]] * max(r["scale"], 1.0), r


def test_cpu_path_is_the_reference_and_add_into_is_in_place():
    x, w, b = torch.randn(3, 40), torch.randn(24, 40), torch.randn(24)
    assert torch.equal(rows_gemm(x, w, b), rows_gemm_reference(x, w, b))
    r = torch.randn(3, 24)
    expect = rows_gemm_reference(x, w, b, r)
    got = r.clone()
    assert rows_gemm(x, w, b, add_into=got) is got and torch.equal(got, expect)


def test_inputs_are_checked():
    w = torch.randn(24, 40)
    for x, field in ((torch.randn(129, 40), "1 <= M <= 128"), (torch.randn(0, 40), "1 <= M"), (torch.randn(40), "M, K")):
        with pytest.raises(ValueError, match=field):
            rows_gemm(x, w)
    with pytest.raises(ValueError, match="weight"):
        rows_gemm(torch.randn(2, 40), torch.randn(40, 24).t())  # not contiguous
    with pytest.raises(ValueError, match="bias"):
        rows_gemm(torch.randn(2, 40), w, torch.randn(23))
    with pytest.raises(ValueError, match="add_into"):
        rows_gemm(torch.randn(2, 40), w, add_into=torch.randn(3, 24))


def test_the_config_depends_on_the_shape_only_and_is_checked():
    for bad, field in (({"block_n": 48}, "block_n"), ({"block_k": 8}, "block_k"), ({"num_warps": 3}, "num_warps"),
                       ({"split": 0}, "split"), ({"num_stages": 0}, "num_stages")):
        with pytest.raises(ValueError, match=field):
            RowsGemmConfig(**bad)
    with pytest.raises(TypeError):
        TABLE[(8, 8)] = RowsGemmConfig()
    assert rows_gemm_config(24576, 4096) is TABLE[(24576, 4096)]
    # the rule: >= 132 programs at M <= 16 where K leaves >= 8 tiles a split; a split only for narrow N
    assert default_config(4096, 4096) == RowsGemmConfig(64, 128, 4, 4, 4)  # 64 n-blocks x 4, 8 tiles a split
    assert default_config(5120, 17408).split == 2 and default_config(14336, 5120).split == 1
    assert default_config(960, 576) == RowsGemmConfig(64, 64, 1, 4, 4)  # K = 9 x 64: too short to split
