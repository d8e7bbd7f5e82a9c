"""The device step's acceptance kernel (kernels/spec/accept.py) equals its torch reference on random
draft trees (through the Triton interpreter on the CPU), and the reference accepts what a DDTree walk
accepts."""

import pytest
import torch

from tests.kernels.interpret import run_module

pytest.importorskip("triton")


def test_tree_accept_kernel_matches_reference():
    result = run_module("tests.kernels.spec.accept_checks")
    assert len(result) == 36
    bad = {k: v for k, v in result.items() if v is not None}
    assert not bad, bad


def test_reference_accepts_the_path_through_siblings():
    """Root 0 with children 1 (token 5) and 2 (token 6); 3 under 2 (token 8). The target says 6 after
    the root and 8 after node 2, so the path is 0 -> 2 -> 3: two drafts kept, and the bonus is the
    target's token at node 3."""
    from treeflash.kernels.spec.accept import tree_accept_reference

    ids = torch.tensor([0, 5, 6, 8])
    parents = torch.tensor([-1, 0, 0, 2])
    depths = torch.tensor([0, 1, 1, 2])
    anc = torch.tensor([1, 0b11, 0b101, 0b1101])
    target = torch.tensor([6, 1, 8, 9])  # at nodes 0..3
    state, result, commit, path = torch.tensor([10, 0, 1]), torch.zeros(7, dtype=torch.long), torch.zeros(20, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    tree_accept_reference(ids, parents, depths, anc, torch.tensor([4]), target, state, result, commit, path, tm=8, head=3)
    assert path.tolist() == [0, 2, 3, 3]
    assert result[:3].tolist() == [2, 2, 3] and result[3:6].tolist() == [6, 8, 9]
    assert state.tolist() == [13, 9, 3]
    assert commit[:4].tolist() == [10, 12, 13, 13] and commit[8:12].tolist() == [10, 11, 12, 13] and commit[16] == 3
