"""Sampled speculation draws exactly from the target's distribution: a chi-square test.

On a random tiny model with 8 tokens, the joint distribution of the first NUM_TOKENS generated
tokens is computed exactly (by enumeration), and the tokens that speculative decoding generates in
NUM_SAMPLES runs are tested against it. The first token comes from prefill; the others come from
verification: sample-and-match on trees and on chains without draft probabilities, Leviathan
rejection sampling on chains with child_probs, recursive rejection on trees whose children were
drawn from q without replacement, each under temperature, top-k, top-p and min-p.

False failures: every chi-square test in this file, test_verify.py and tests/models/test_mtp_gguf.py uses the threshold
chi2.ppf(1 - ALPHA / NUM_TESTS, df), so a correct verifier fails one of them with probability
below ALPHA = 1e-3 (Bonferroni); the seeds are fixed, so a run is also reproducible. The test
can fail: a verifier that accepts every draft and one that resamples rejections from p instead
of the residual max(p - q, 0) both fail it.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.spec.oracle_drafter import FactorizedDrafter, OracleDrafter
from tests.spec.test_draft_model import tiny_lm  # noqa: F401 (fixture)
from treeflash.models.step import StepInput
from treeflash.spec import decoder as decoder_module
from treeflash.spec.decoder import Decoder
from treeflash.spec.draft_model import DraftModelDrafter
from treeflash.spec.ngram import NgramDrafter
from treeflash.spec.sampling import SamplingParams, sample, target_probs
from treeflash.spec.verify import VerifyResult

ALPHA = 1e-3  # false-failure rate of the whole file (and test_verify.py), by design
NUM_TESTS = 14  # chi-square tests that must pass: 9 here, 3 in test_verify.py, 2 in tests/models/test_mtp_gguf.py
VOCAB = 8
PROMPT = [1, 5, 2, 7, 1, 5]
NUM_TOKENS = 3  # the joint of (prefill token, two speculated tokens): 512 cells
NUM_SAMPLES = 1000
HEAD_GAIN = 3.0  # sharpens the random model's next-token distributions (entropy ~1 nat)


# -- chi-square, without scipy --
def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)))


def chi2_quantile(df: int, tail: float) -> float:
    """The x with P(X > x) = tail (bisection; sf is decreasing in x)."""
    lo, hi = 0.0, df + 20.0 * math.sqrt(2 * df) + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2


def chi_square(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; cells expecting < 5 are pooled. An outcome of
    probability zero gives infinity."""
    if any(probs.get(k, 0.0) == 0.0 for k in counts):
        return math.inf, 1
    cells = sorted(probs, key=lambda k: probs[k])
    bins, pool_e, pool_o = [], 0.0, 0
    for k in cells:
        e = n * probs[k]
        if e < 5:
            pool_e, pool_o = pool_e + e, pool_o + counts.get(k, 0)
        else:
            bins.append([e, counts.get(k, 0)])
    if pool_e > 0:
        if pool_e < 5 and bins:  # too small alone: merge with the smallest kept cell
            bins[0][0] += pool_e
            bins[0][1] += pool_o
        else:
            bins.append([pool_e, pool_o])
    stat = sum((o - e) ** 2 / e for e, o in bins)
    return stat, max(1, len(bins) - 1)


def threshold(df: int) -> float:
    return chi2_quantile(df, ALPHA / NUM_TESTS)


# -- the models and the exact distribution --
def sharp_lm(seed: int, arch: str = "llama"):
    model = tiny_lm(arch, seed, vocab_size=VOCAB, num_hidden_layers=1)  # one layer: thousands of runs stay cheap
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_GAIN)
    return model


@torch.inference_mode()
def exact_joint(model, prompt: list[int], params: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(first n generated tokens), by enumerating every prefix of nonzero probability."""
    dist = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, p in dist.items():
            seq = prompt + list(prefix)
            logits = model(StepInput.plain(torch.tensor(seq), 0), model.new_cache(len(seq))).logits[-1:]
            q = target_probs(logits, params)[0].tolist()
            for tok, qt in enumerate(q):
                if qt > 0:
                    nxt[prefix + (tok,)] = p * qt
        dist = nxt
    return dist


def sample_runs(model, drafter, params: SamplingParams, n_tokens: int, n_runs: int, seed: int, check: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    dec = Decoder(model, model.new_cache(len(PROMPT) + n_tokens + 16), params, drafter, generator=g)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n_runs):
        out = [dec.prefill(PROMPT)]
        while len(out) < n_tokens:
            out.extend(dec.step())
        key = tuple(out[:n_tokens])
        counts[key] = counts.get(key, 0) + 1
    if drafter is not None and check:  # the runs exercised both acceptance and rejection
        assert dec.stats.accepted_per_depth and dec.stats.accepted_per_depth[0] > 0, "no draft was ever accepted"
        assert dec.stats.committed < dec.stats.passes * (1 + len(dec.stats.accepted_per_depth)), "nothing was rejected"
    return counts


def statistic(model, drafter, params, seed=0, check=True) -> tuple[float, float]:
    counts = sample_runs(model, drafter, params, NUM_TOKENS, NUM_SAMPLES, seed, check)
    stat, df = chi_square(counts, exact_joint(model, PROMPT, params, NUM_TOKENS), NUM_SAMPLES)
    return stat, threshold(df)


T1 = SamplingParams(temperature=1.0)
PROCESSED = SamplingParams(temperature=1.3, top_k=5, top_p=0.9, min_p=0.05)
CASES = {
    # name: (drafter factory (target -> drafter), sampling params)
    "tree sample-and-match": (lambda t: OracleDrafter(t, depth=2, width=3, corrupt=0.3, vocab=VOCAB), T1),
    "tree top-k/top-p/min-p": (lambda t: OracleDrafter(t, depth=2, width=2, corrupt=0.3, vocab=VOCAB), PROCESSED),
    "chain without q (ngram)": (lambda t: NgramDrafter(num_draft=2, ngram_max=2), SamplingParams(temperature=0.7)),
    "chain rejection": (lambda t: DraftModelDrafter(sharp_lm(1, "qwen3"), 2, VOCAB), T1),
    "chain rejection top-k/top-p/min-p": (lambda t: DraftModelDrafter(sharp_lm(2, "qwen2"), 2, VOCAB), PROCESSED),
    "tree recursive rejection": (lambda t: FactorizedDrafter(sharp_lm(1, "qwen3"), budget=5), T1),
    "tree recursive rejection T=0.6": (lambda t: FactorizedDrafter(sharp_lm(3, "qwen3"), budget=4),
                                       SamplingParams(temperature=0.6)),
    "tree recursive rejection top-k/top-p/min-p": (lambda t: FactorizedDrafter(sharp_lm(2, "qwen2"), budget=5), PROCESSED),
}


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_the_target(case):
    make_drafter, params = CASES[case]
    target = sharp_lm(0)
    stat, limit = statistic(target, make_drafter(target), params)
    assert stat < limit, f"{case}: chi-square {stat:.1f} >= {limit:.1f}"


def accept_everything(tree, logits, params, generator, argmax=None, masks=None):
    """WRONG: commits every draft of a chain, then a bonus token from the last node."""
    probs = target_probs(logits, params)
    path = list(range(tree.num_nodes))
    return VerifyResult(path, tree.token_ids[1:].tolist() + [int(sample(probs[-1:], generator)[0])])


def resample_from_p(tree, logits, params, generator, argmax=None, masks=None):
    """WRONG: rejection sampling that redraws a rejected token from p instead of max(p - q, 0)."""
    probs, q_all, ids = target_probs(logits, params), tree.child_probs, tree.token_ids.tolist()
    path, tokens = [0], []
    for d in range(tree.num_nodes - 1):
        p, q, x = probs[d], q_all[d], ids[d + 1]
        if torch.rand((), generator=generator) * q[x] < p[x]:
            path.append(d + 1)
            tokens.append(x)
            continue
        return VerifyResult(path, tokens + [int(sample(p[None], generator)[0])])
    return VerifyResult(path, tokens + [int(sample(probs[-1:], generator)[0])])


@pytest.mark.parametrize("wrong", [accept_everything, resample_from_p])
def test_a_wrong_verifier_fails(monkeypatch, wrong):
    monkeypatch.setattr(decoder_module, "verify", wrong)
    make_drafter, params = CASES["chain rejection"]
    target = sharp_lm(0)
    stat, limit = statistic(target, make_drafter(target), params, check=False)
    assert stat > limit, f"{wrong.__name__} went unnoticed: chi-square {stat:.1f} < {limit:.1f}"


def test_exact_distribution_and_plain_sampling_agree():
    """The reference itself: plain sampling (no drafter) passes the same test."""
    target = sharp_lm(0)
    counts = sample_runs(target, None, T1, NUM_TOKENS, NUM_SAMPLES, seed=1)
    joint = exact_joint(target, PROMPT, T1, NUM_TOKENS)
    assert abs(sum(joint.values()) - 1) < 1e-5
    stat, df = chi_square(counts, joint, NUM_SAMPLES)
    assert stat < threshold(df)
    assert abs(chi2_quantile(10, 0.05) - 18.307) < 1e-3 and abs(chi2_quantile(1, 1e-3) - 10.828) < 1e-3
