"""Constrained sampled speculation draws exactly from the constrained target: a chi-square test.

As tests/spec/test_sampled.py, on its random 8-token model, with a constraint that forbids half the
vocabulary at every position (tests/spec/rule_constraint.py): the joint distribution of the first
NUM_TOKENS tokens of plain constrained decoding (the masked logits, then the request's sampler) is
enumerated exactly, and speculative runs are tested against it, for sample-and-match on trees, chain
rejection sampling and recursive rejection over sampled trees (where forbidden children stay in the
tree as leaves, as they do in chains). The threshold is chi2.ppf(1 - ALPHA / NUM_TESTS, df), so a correct verifier fails one
of these with probability below ALPHA; the seeds are fixed. A verifier that drops the masks fails, and
so does pruning forbidden drafts from a chain verified by rejection sampling (46 against 29 at seed 0).
"""

from __future__ import annotations

import pytest
import torch

from tests.spec.oracle_drafter import FactorizedDrafter, OracleDrafter
from tests.spec.rule_constraint import RuleConstraint, alternating
from tests.spec.test_draft_model import tiny_lm  # noqa: F401 (fixture)
from tests.spec.test_sampled import PROMPT, VOCAB, chi2_quantile, chi_square, sharp_lm
from treeflash.models.step import StepInput
from treeflash.spec import constrained_tree
from treeflash.spec import decoder as decoder_module
from treeflash.spec.constraint import masked
from treeflash.spec.decoder import Decoder
from treeflash.spec.draft_model import DraftModelDrafter
from treeflash.spec.sampling import SamplingParams, target_probs

ALPHA = 1e-3
NUM_TESTS = 3  # the chi-square tests of this file that must pass
NUM_TOKENS = 3
NUM_SAMPLES = 1000


@torch.inference_mode()
def exact_constrained_joint(model, params: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    rule = alternating(VOCAB)
    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, p in dist.items():
            seq = PROMPT + list(prefix)
            logits = model(StepInput.plain(torch.tensor(seq), 0), model.new_cache(len(seq))).logits[-1:]
            allowed = torch.zeros(VOCAB, dtype=torch.bool)
            allowed[sorted(rule(list(prefix)))] = True
            q = target_probs(masked(logits, allowed), params)[0].tolist()
            for tok, qt in enumerate(q):
                if qt > 0:
                    nxt[prefix + (tok,)] = p * qt
        dist = nxt
    return dist


def constrained_runs(model, drafter, params: SamplingParams, seed: int = 0, strict: bool = True) -> tuple[dict, object]:
    g = torch.Generator().manual_seed(seed)
    dec = Decoder(model, model.new_cache(len(PROMPT) + NUM_TOKENS + 16), params, drafter, generator=g,
                  constraint=RuleConstraint(VOCAB, alternating(VOCAB), strict))
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(NUM_SAMPLES):
        out = [dec.prefill(PROMPT)]
        while len(out) < NUM_TOKENS:
            out.extend(dec.step())
        key = tuple(out[:NUM_TOKENS])
        counts[key] = counts.get(key, 0) + 1
    return counts, dec.stats


T1 = SamplingParams(temperature=1.0)
PROCESSED = SamplingParams(temperature=1.3, top_k=5, top_p=0.9, min_p=0.05)
CASES = {
    "tree sample-and-match": (lambda t: OracleDrafter(t, depth=2, width=3, corrupt=0.3, vocab=VOCAB), T1),
    "chain rejection top-k/top-p/min-p": (lambda t: DraftModelDrafter(sharp_lm(2, "qwen2"), 2, VOCAB), PROCESSED),
    "tree recursive rejection": (lambda t: FactorizedDrafter(sharp_lm(1, "qwen3"), budget=5),
                                 SamplingParams(temperature=1.0, tree_sampling="rejection")),
}


def statistic(make_drafter, params, strict: bool = True) -> tuple[float, float]:
    target = sharp_lm(0)
    counts, stats = constrained_runs(target, make_drafter(target), params, strict=strict)
    assert stats.accepted_per_depth and stats.accepted_per_depth[0] > 0, "no draft was ever accepted"
    stat, df = chi_square(counts, exact_constrained_joint(target, params, NUM_TOKENS), NUM_SAMPLES)
    return stat, chi2_quantile(df, ALPHA / NUM_TESTS)


@pytest.mark.parametrize("case", list(CASES))
def test_constrained_speculative_sampling_matches_the_constrained_target(case):
    stat, limit = statistic(*CASES[case])
    assert stat < limit, f"{case}: chi-square {stat:.1f} >= {limit:.1f}"


def test_a_verifier_without_the_masks_fails(monkeypatch):
    """WRONG: verification on the unconstrained target (the masks dropped after pruning)."""
    monkeypatch.setattr(constrained_tree.NodeMasks, "at", lambda self, node: None)
    stat, limit = statistic(*CASES["tree sample-and-match"], strict=False)
    assert stat > limit


def test_pruning_forbidden_drafts_under_chain_rejection_fails(monkeypatch):
    """WRONG: forbidden drafts removed even where the rule uses q (the reason uses_draft_probs exists)."""
    monkeypatch.setattr(decoder_module, "uses_draft_probs", lambda tree, params: False)
    stat, limit = statistic(*CASES["chain rejection top-k/top-p/min-p"])
    assert stat > limit
