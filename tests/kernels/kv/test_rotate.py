"""The rotation kernel (kernels/kv/rotate.py: query, centered key and output rows rotated in one launch) against
its torch reference through the Triton interpreter on the CPU, and its input checks."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module


def test_rotate_rows_matches_reference():
    assert_all_passed(run_module("tests.kernels.kv.rotate_checks"), expected=7)


def test_rotate_rows_rejects_bad_input():
    from treeflash.kernels.kv.rotate import rotate_rows

    with pytest.raises(ValueError, match=r"\[N, H, D\]"):
        rotate_rows(torch.zeros(4, 64), torch.float32)
    with pytest.raises(ValueError, match="contiguous last axis"):
        rotate_rows(torch.zeros(2, 3, 64).transpose(1, 2), torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        rotate_rows(torch.zeros(2, 3, 48), torch.float32)
    with pytest.raises(ValueError, match="offset"):
        rotate_rows(torch.zeros(2, 3, 64), torch.float32, offset=torch.zeros(3, 32))
