"""The drafter's top-k log-probs kernel (kernels/spec/topk.py) equals its torch reference (through the
Triton interpreter on the CPU): the same ids, log-probs within 1e-5, the lower id first on ties."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module

pytest.importorskip("triton")


def test_topk_logprobs_kernel_matches_reference():
    assert_all_passed(run_module("tests.kernels.spec.topk_checks"), expected=12)


def test_cpu_path_is_the_reference_and_writes_out():
    from treeflash.kernels.spec.topk import topk_logprobs

    logits = torch.randn(3, 500).bfloat16()
    want_lp, want_ids = torch.log_softmax(logits.float(), dim=-1).topk(5, dim=-1)
    out = (torch.empty(3, 5), torch.empty(3, 5, dtype=torch.long))
    lp, ids = topk_logprobs(logits, 5, out=out)
    assert lp is out[0] and ids is out[1]
    assert torch.equal(ids, want_ids) and torch.equal(lp, want_lp)
    with pytest.raises(ValueError, match="k <= min"):
        topk_logprobs(logits, 65)
