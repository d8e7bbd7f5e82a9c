"""The fused linear kernel (RMSNorm prologue, SwiGLU / residual epilogues) equals its plain-torch
reference, run through the Triton interpreter on the CPU. fp32 checks the logic to rounding
(2e-6 relative). bf16 checks the roundings' placement only loosely: the kernel and the reference
sum in different orders, and the GEMV output, SwiGLU and residual add each round to bf16, so a
one-unit flip early can grow to ~5 units (2^-7 relative each) at the output."""

import pytest

from tests.kernels.interpret import run_module


@pytest.mark.parametrize("dtype,rel", [("float32", 2e-6), ("bfloat16", 6 * 2**-7)])
def test_linear_fused_matches_reference(dtype, rel):
    errors = run_module("tests.kernels.linear.linear_checks", dtype)
    assert len(errors) == 10  # 6 cases, 3 of one row also through the CUDA-core GEMV, batch invariance
    assert errors["batch_invariance"][0] == 0.0
    for case, (err, scale) in errors.items():
        assert err <= rel * max(scale, 1.0), (case, err, scale)


def test_linear_fused_rejects_bad_shapes():
    import torch

    from treeflash.kernels.linear import fused as linear

    x, w = torch.randn(2, 8), torch.randn(4, 8)
    linear._interpreting = lambda: True  # noqa: the wrapper's checks run before any launch
    try:
        with pytest.raises(ValueError, match="weight"):
            linear.linear_fused(x, torch.randn(4, 9))
        with pytest.raises(ValueError, match="swiglu"):
            linear.linear_fused(x, torch.randn(5, 8), swiglu=True)
        with pytest.raises(ValueError, match="residual"):
            linear.linear_fused(x, w, residual=torch.randn(2, 3))
    finally:
        from treeflash.kernels.pointwise.norm import _interpreting

        linear._interpreting = _interpreting
