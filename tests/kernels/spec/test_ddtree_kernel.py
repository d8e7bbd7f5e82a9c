"""The DDTree search kernel (kernels/spec/ddtree.py) builds kernels/ddtree.best_first's tree node for node
(tokens, parents, depths, ancestor masks, node count), under the Triton interpreter on the CPU;
so does its host fallback."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module


def test_ddtree_kernel_matches_best_first():
    assert_all_passed(run_module("tests.kernels.spec.ddtree_checks"), expected=72)


def test_ddtree_kernel_rejects_budgets_past_the_bitmask():
    from treeflash.kernels.spec.ddtree import ddtree

    with pytest.raises(ValueError, match="62"):
        ddtree(torch.zeros(3, 64, dtype=torch.float64), torch.zeros(3, 64, dtype=torch.long), torch.tensor([1]), 63, True)
