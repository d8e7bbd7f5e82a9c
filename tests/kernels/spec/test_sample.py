"""The sort-free sampler of sampled device steps (kernels/spec/sample.py) draws the tokens its reference
draws (processed_probs_static + sample_static with top-k and top-p off), through the Triton
interpreter on the CPU; its reference's distribution is tested in tests/spec/test_device_sampling.py."""

import pytest
import torch

from tests.kernels.interpret import assert_all_passed, run_module

pytest.importorskip("triton")


def test_sample_rows_kernel_matches_reference():
    assert_all_passed(run_module("tests.kernels.spec.sample_checks"), expected=5)


def test_reference_is_the_static_sampler_with_filters_off():
    from treeflash.kernels.spec.sample import sample_rows, sample_rows_reference
    from treeflash.kernels.spec.sample import sample_static
    from treeflash.spec.sampling import OFF_TOP_P, processed_probs_static

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 2
    fparams = torch.tensor([0.8, 0.5, 0.05])  # the top_p slot is ignored
    seed, counter, index = torch.tensor([3]), torch.tensor([1]), torch.arange(5)
    probs = processed_probs_static(logits, torch.tensor([0.8, OFF_TOP_P, 0.05]), torch.tensor([300]))
    want = sample_static(probs, seed, counter, index)
    assert torch.equal(sample_rows_reference(logits, fparams, seed, counter, index), want)
    assert torch.equal(sample_rows(logits, fparams, seed, counter, index), want)  # the CPU path is the reference


def test_bad_arguments():
    from treeflash.kernels.spec import sample

    with pytest.raises(ValueError, match="fparams"):
        sample.sample_rows(torch.zeros(2, 8), torch.zeros(3, dtype=torch.float64), torch.zeros(1, dtype=torch.long),
                           torch.zeros(1, dtype=torch.long), torch.arange(2))
    with pytest.raises(ValueError, match="index"):
        sample.sample_rows(torch.zeros(2, 8), torch.ones(3), torch.zeros(1, dtype=torch.long),
                           torch.zeros(1, dtype=torch.long), torch.arange(3))
