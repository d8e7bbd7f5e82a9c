"""The commit kernels (kernels/spec/commit.py: attention rows, K and V in one launch; the conv window in
place) equal their references bitwise through the Triton interpreter on the CPU."""

import pytest
import torch

from tests.kernels.interpret import run_module


def test_commit_kernels_match_references():
    result = run_module("tests.kernels.spec.commit_checks")
    assert len(result) == 10
    assert all(result.values()), result


def test_commit_kernels_reject_bad_input():
    from treeflash.kernels.spec import commit

    saved = commit._interpreting
    commit._interpreting = lambda: True  # the wrappers' checks run before any launch
    try:
        with pytest.raises(ValueError, match="row size"):
            commit.RowTable([torch.zeros(4, 8), torch.zeros(4, 6)])
        with pytest.raises(ValueError, match="dest and src"):
            commit.commit_rows_table(commit.RowTable([torch.zeros(4, 8)]), torch.arange(2), torch.arange(3), torch.tensor([2]))
        with pytest.raises(ValueError, match="taps"):
            commit.conv_window_commit(torch.zeros(8, 5), torch.zeros(2, 8), torch.arange(5))
    finally:
        commit._interpreting = saved
