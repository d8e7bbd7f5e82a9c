"""Sampled requests on device steps (spec/device_step.py) draw exactly from the target's
distribution: the same chi-square test as test_sampled.py, on its tiny 8-token model.

Each draw inside the step graph comes from spec/sampling.processed_probs_static (every filter
always on, neutral where off) and sample_static (inverse CDF over a counter-based hash); the step
then walks the tree like sample-and-match. Tested here:
- the static sampler against target_probs, one row drawn 20,000 times, per parameter set;
- whole decodes (prefill token + two tokens from device steps, 512 joint cells) against the exact
  joint: a DDTree under temperature (the sort-free sampler, kernels/spec/sample.py's reference on the CPU)
  and under top-k/top-p/min-p (the sorting graph), a chain under the latter;
- the test's power: device steps that take the argmax instead of a draw fail it.

False failures: the chi-square thresholds are chi2.ppf(1 - ALPHA / NUM_TESTS, df) over this file's
NUM_TESTS tests, so a correct sampler fails one with probability below ALPHA; seeds are fixed.
"""

from __future__ import annotations

import pytest
import torch

from tests.spec.test_dflash_model import random_drafter
from tests.spec.test_sampled import PROCESSED, PROMPT, T1, VOCAB, chi2_quantile, chi_square, exact_joint, sharp_lm
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.device_step import DeviceStep
from treeflash.spec.dflash import DFlashDrafter
from treeflash.kernels.spec.sample import sample_static
from treeflash.spec.sampling import needs_order, processed_probs_static, static_params, target_probs

ALPHA = 1e-3
NUM_TESTS = 5  # chi-square tests that must pass: 2 sampler + 3 decodes
NUM_TOKENS = 3
NUM_SAMPLES = 1000


def threshold(df: int) -> float:
    return chi2_quantile(df, ALPHA / NUM_TESTS)


@pytest.mark.parametrize("params", [T1, PROCESSED], ids=["t1", "processed"])
def test_static_sampler_draws_the_processed_distribution(params):
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    want = target_probs(logits, params)[0]
    floats, top_k = static_params(params, VOCAB)
    probs = processed_probs_static(logits, torch.tensor(floats), torch.tensor([top_k]))
    torch.testing.assert_close(probs[0], want, atol=1e-6, rtol=0)
    n = 20_000
    draws = sample_static(probs.expand(n, -1), torch.tensor([11]), torch.tensor([0]), torch.arange(n))
    counts = {(t,): int(c) for t, c in enumerate(torch.bincount(draws, minlength=VOCAB).tolist()) if c}
    assert all(want[t[0]] > 0 for t in counts)  # nothing outside the processed support
    stat, df = chi_square(counts, {(t,): float(p) for t, p in enumerate(want.tolist()) if p > 0}, n)
    assert stat < threshold(df)


def device_runs(params, tree: bool, seed: int = 0, targets=None, check: bool = True):
    """Joint counts of the first NUM_TOKENS tokens over NUM_SAMPLES decodes whose steps run on the device."""
    target = sharp_lm(0)
    model = random_drafter(target, block_size=8, target_layer_ids=(0,))  # the prompt's 6 rows fit one pass
    cache = target.new_cache(len(PROMPT) + NUM_TOKENS + 16)
    drafter = DFlashDrafter(target, model, budget=5 if tree else 3, tree=tree)
    runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(runner)
    forward = runner.forward
    runner.forward = lambda step, *a, **k: (verifies.append(1) if step.is_verify else None) or forward(step, *a, **k)
    verifies: list[int] = []  # synchronous verify passes: none may run
    dec = Decoder(target, cache, params, drafter, generator=torch.Generator().manual_seed(seed), runner=runner)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(NUM_SAMPLES):
        out = [dec.prefill(PROMPT)]
        if targets is not None:
            dec._dev._targets = targets.__get__(dec._dev)
        while len(out) < NUM_TOKENS:
            out.extend(dec.step())
        counts[tuple(out[:NUM_TOKENS])] = counts.get(tuple(out[:NUM_TOKENS]), 0) + 1
    assert dec._dev is not None and dec._dev.sampled and not verifies
    # top-k / top-p sort in a graph of their own; temperature and min-p draw with kernels/spec/sample.py's sampler
    assert dec._dev is drafter.loops["device_step_filtered" if needs_order(params) else "device_step_sampled"]
    assert dec._dev.filtered == needs_order(params)
    stats = dec.stats
    if check:  # the runs exercised both acceptance and rejection
        assert stats.accepted_per_depth[0] > 0, "no draft was ever accepted"
        assert stats.committed < stats.passes * (1 + len(stats.accepted_per_depth)), "nothing was rejected"
    return counts, target


@pytest.mark.parametrize("params,tree", [(T1, True), (PROCESSED, True), (PROCESSED, False)],
                         ids=["ddtree-t1", "ddtree-processed", "chain-processed"])
def test_device_steps_sample_the_target(params, tree, monkeypatch):
    steps = []
    real = DeviceStep.enqueue
    monkeypatch.setattr(DeviceStep, "enqueue", lambda self: steps.append(1) or real(self))
    counts, target = device_runs(params, tree)
    assert len(steps) >= NUM_SAMPLES  # every run's steps ran on the device
    stat, df = chi_square(counts, exact_joint(target, PROMPT, params, NUM_TOKENS), NUM_SAMPLES)
    assert stat < threshold(df), f"chi-square {stat:.1f} >= {threshold(df):.1f}"


def test_a_step_that_takes_the_argmax_fails():
    def argmax_targets(self, out):
        return out.argmax[: self.t]

    counts, target = device_runs(T1, True, targets=argmax_targets, check=False)
    stat, df = chi_square(counts, exact_joint(target, PROMPT, T1, NUM_TOKENS), NUM_SAMPLES)
    assert stat > threshold(df)
