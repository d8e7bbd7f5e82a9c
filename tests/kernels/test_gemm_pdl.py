"""The verify rows' PDL GEMM (kernels/gemm_pdl.py) equals its reference within one rounding, through
the Triton interpreter on the CPU; the folded verify path takes it where enabled."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module


def test_gemm_pdl_matches_reference():
    assert_all_passed(run_module("tests.kernels.gemm_pdl_checks"), 10)


def test_gemm_pdl_rejects_bad_shapes(monkeypatch):
    from treeflash.kernels import gemm_pdl

    monkeypatch.setattr(gemm_pdl, "_interpreting", lambda: True)  # the wrapper's checks run before any launch
    with pytest.raises(ValueError, match="matching K"):
        gemm_pdl.gemm(torch.zeros(3, 8), torch.zeros(4, 6))
    with pytest.raises(ValueError, match="add_into"):
        gemm_pdl.gemm(torch.zeros(3, 8), torch.zeros(4, 8), add_into=torch.zeros(3, 5))


def test_gemm_pdl_is_opt_in_on_the_gpu_and_on_in_the_interpreter(monkeypatch):
    from treeflash.kernels import gemm_pdl

    assert not gemm_pdl.enabled(torch.zeros(2, 2))  # CPU, no interpreter: torch
    monkeypatch.setenv(gemm_pdl.ENV, "1")
    assert not gemm_pdl.enabled(torch.zeros(2, 2))  # opt-in, and still only where PDL is (CUDA, sm_90+)
    monkeypatch.delenv(gemm_pdl.ENV)
    monkeypatch.setattr(gemm_pdl, "_interpreting", lambda: True)
    assert gemm_pdl.enabled(torch.zeros(2, 2))
    monkeypatch.setenv(gemm_pdl.ENV, "0")
    assert not gemm_pdl.enabled(torch.zeros(2, 2))
