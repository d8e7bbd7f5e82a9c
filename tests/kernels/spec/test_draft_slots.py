"""A static draft pass's slots and rotary rows in one launch (kernels/spec/draft_slots.py) equal the torch form
(through the Triton interpreter), and off CUDA the torch form is what runs."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module

pytest.importorskip("triton")


def test_draft_slots_kernel_matches_reference():
    assert_all_passed(run_module("tests.kernels.spec.draft_slots_checks"), expected=12)


def test_cpu_path_is_the_reference():
    from treeflash.kernels.spec.draft_slots import draft_slots

    table = torch.randn(2, 50, 8)  # rotary_dim 8: the kernel takes >= 16 anyway
    slots, cs = draft_slots(torch.tensor([10]), torch.tensor([2]), 4, 3, 49, table)
    assert slots.tolist() == [10, 11, 49, 49, 12, 13, 14]
    assert torch.equal(cs, table[:, slots])
