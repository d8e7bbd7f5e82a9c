"""The request's sampler against an independent reference: transformers' logits processors.

test_sampled.py builds its expected distribution with `target_probs`, the function it tests, so a
bug in the temperature / top-k / top-p / min-p processing would go unnoticed there. Here
`sampling.target_probs` and `sampling.pick` (what plain decoding, verification and the draft
model's `draft_token` sample with) are compared with transformers 5.17's TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper, applied in the order
`GenerationMixin._get_logits_processor` applies them (temperature, top-k, top-p, min-p: the order
sampling.py applies and docs/speculative.md lists them), on thousands of random logit rows and
every combination of a parameter grid, plus hand-made edge cases.

Semantics that agree (checked): top-k keeps every token tied with the k-th (both compare
`logits < kth`); top_k >= vocab and top_k = 0 are no-ops; top-p keeps the smallest prefix of the
descending order whose mass reaches top_p (a token is dropped when the mass strictly before it is
>= top_p: transformers drops it when the ascending cumulative mass up to it is <= 1 - top_p, the
same set); top_p = 1 is a no-op; min-p drops p < min_p * max p, after top-p (the max is the same
whether or not the survivors are renormalized), and keeps ties with the max at min_p = 1.

Intended difference (documented, not asserted equal): when tokens of *exactly* equal probability
straddle the top-p boundary, both keep the same number of them, but which of the tied tokens
survive depends on the order torch.sort puts equal values in (transformers sorts ascending,
treeflash descending), so the kept *sets* may differ. On such rows the test compares the sorted
probability vectors (same count kept at each tied level) instead of token by token. Rows whose
top-p or min-p boundary lies within float rounding of the threshold are likewise ambiguous (the
two sides accumulate the mass in opposite orders); they are counted, kept rare, and compared
only away from the boundary.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from treeflash.spec.sampling import SamplingParams, pick, target_probs

V = 64
TEMPERATURES = [0.05, 0.7, 1.0, 1.8]
TOP_K = [0, 1, 5, 37, V - 1, V, V + 7]  # 0 = off; V and V + 7: not smaller than the vocabulary
TOP_P = [1.0, 0.95, 0.6, 0.2]
MIN_P = [0.0, 0.02, 0.3, 1.0]
GRID = [SamplingParams(t, k, p, m) for t, k, p, m in itertools.product(TEMPERATURES, TOP_K, TOP_P, MIN_P)]
EDGE = 1e-5  # closer than this (relative) to a top-p / min-p threshold: float rounding decides


def hf_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The reference: transformers' warpers as generate() builds them for do_sample=True, then softmax."""
    procs = LogitsProcessorList()
    if params.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k != 0:
        procs.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(params.top_p))
    procs.append(MinPLogitsWarper(params.min_p))  # generate() adds it whenever min_p is set; 0 is a no-op
    # float32, as generate() runs on float32 logits (float64 would keep tail probabilities of
    # ~1e-40 that both sides round to zero in float32; no sampler can draw them anyway)
    scores = procs(torch.zeros((logits.shape[0], 1), dtype=torch.long), logits.float().clone())
    return torch.softmax(scores, dim=-1).double()


def random_logits(seed: int, rows: int = 48) -> torch.Tensor:
    """Rows at several scales (flat to peaked), some with masked (-inf) tokens."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 1.0, 3.0, 8.0]).repeat_interleave(rows // 4)[:, None]
    logits = torch.randn(rows, V, generator=g) * scale
    masked = torch.rand(rows, V, generator=g) < 0.2
    masked[: rows // 2] = False
    masked[:, 0] = False  # every row keeps a finite token
    return logits.masked_fill(masked, float("-inf"))


def tied_logits(seed: int, rows: int = 48) -> torch.Tensor:
    """Logits on a coarse grid: many exact ties, at the top-k, top-p and min-p boundaries too."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * 2).round() / 2


def ambiguous_rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows whose top-p or min-p decision sits within float rounding of its threshold (float64 truth)."""
    x = logits.double() / (params.temperature or 1.0)
    if params.top_k and params.top_k < V:
        x = x.masked_fill(x < torch.topk(x, params.top_k, dim=-1).values[..., -1:], float("-inf"))
    p = torch.softmax(x, dim=-1)
    amb = torch.zeros(logits.shape[0], dtype=torch.bool)
    if params.top_p < 1.0:
        sp, order = p.sort(dim=-1, descending=True)
        before = sp.cumsum(-1) - sp
        amb |= ((before - params.top_p).abs() < EDGE).any(-1)
        p = p.masked_fill(torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, before >= params.top_p), 0.0)
    if params.min_p > 0.0:
        ratio = p / p.amax(-1, keepdim=True)
        near = (ratio - params.min_p).abs() < EDGE * params.min_p
        amb |= (near & (ratio < 1.0)).any(-1)  # ties with the max itself compare equal on both sides
    return amb


def compare(probs_fn, logits: torch.Tensor, params: SamplingParams, tied: bool) -> tuple[int, int]:
    """(mismatching rows, ambiguous rows skipped) of probs_fn against the reference."""
    ours, ref = probs_fn(logits, params).double(), hf_probs(logits, params)
    amb = ambiguous_rows(logits, params)
    if tied:  # which of exactly tied tokens survive top-p may differ (see the module docstring)
        ours, ref = ours.sort(-1).values, ref.sort(-1).values
    same_support = ((ours > 0) == (ref > 0)).all(-1)
    close = ((ours - ref).abs() <= 1e-5 + 1e-4 * ref).all(-1)
    bad = ~(same_support & close) & ~amb
    return int(bad.sum()), int(amb.sum())


def grid_mismatches(probs_fn) -> tuple[int, int, int]:
    """(mismatching rows, ambiguous rows, rows) over the whole grid, continuous and tied logits."""
    bad = amb = total = 0
    for i, params in enumerate(GRID):
        for tied, logits in ((False, random_logits(i)), (True, tied_logits(i))):
            b, a = compare(probs_fn, logits, params, tied)
            bad, amb, total = bad + b, amb + a, total + logits.shape[0]
    return bad, amb, total


def test_target_probs_equals_transformers_warpers():
    bad, amb, total = grid_mismatches(target_probs)
    assert total == len(GRID) * 96 and len(GRID) == 448
    assert bad == 0, f"{bad} of {total} rows differ from transformers' warpers"
    assert amb < total // 100  # the float-rounding exclusions are rare


@pytest.mark.parametrize("seed", [0, 1])
def test_pick_samples_what_transformers_would(seed):
    """pick() draws from the reference distribution: with the same generator state, the same
    token as torch.multinomial on transformers' probabilities; greedy is the raw argmax."""
    g = torch.Generator().manual_seed(1000 + seed)
    params_list = [SamplingParams(*[c[int(torch.randint(len(c), (), generator=g))] for c in (TEMPERATURES, TOP_K, TOP_P, MIN_P)])
                   for _ in range(60)]
    drawn = 0
    for i, params in enumerate(params_list):
        logits = random_logits(10_000 * (seed + 1) + i)
        keep = ~ambiguous_rows(logits, params)
        logits = logits[keep]
        ours = pick(logits, params, torch.Generator().manual_seed(i))
        ref = torch.multinomial(hf_probs(logits, params).float(), 1, generator=torch.Generator().manual_seed(i))[:, 0]
        assert torch.equal(ours, ref), params
        assert (hf_probs(logits, params)[torch.arange(len(ours)), ours] > 0).all()
        drawn += len(ours)
    assert drawn > 2500
    logits = random_logits(seed)
    assert torch.equal(pick(logits, SamplingParams(), None), logits.argmax(-1))  # greedy: no processing, no draw
    assert torch.equal(target_probs(logits, SamplingParams()).argmax(-1), logits.argmax(-1))


def row(values) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float32)


def kept(probs: torch.Tensor) -> list[int]:
    return (probs[0] > 0).nonzero()[:, 0].tolist()


@pytest.mark.parametrize(
    "logits,params,expect",
    [
        # top-k: ties with the k-th token are all kept, by both
        ([3.0, 2.0, 2.0, 2.0, 1.0, 0.0], SamplingParams(1.0, top_k=2), [0, 1, 2, 3]),
        # top_k larger than the vocabulary, and equal to it: nothing dropped
        ([3.0, 2.0, 1.0, 0.0], SamplingParams(1.0, top_k=50), [0, 1, 2, 3]),
        ([3.0, 2.0, 1.0, 0.0], SamplingParams(1.0, top_k=4), [0, 1, 2, 3]),
        # top_p = 1: nothing dropped, even far in the tail
        ([30.0, 0.0, -30.0, -60.0], SamplingParams(1.0, top_p=1.0), [0, 1, 2, 3]),
        # masked tokens stay masked; top-k beyond the finite ones keeps only the finite ones
        ([1.0, float("-inf"), 0.5, float("-inf")], SamplingParams(0.5, top_k=3), [0, 2]),
        # min_p = 1 keeps exactly the tokens tied with the max
        ([2.0, 5.0, 5.0, 1.0], SamplingParams(1.0, min_p=1.0), [1, 2]),
        # the order matters: temperature before min-p (at T=1 token 1 has p/max = e^-1 > 0.3;
        # at T=0.5 it has e^-2 < 0.3), top-k before top-p (top-p on the renormalized top-2)
        ([1.0, 0.0, -5.0], SamplingParams(0.5, min_p=0.3), [0]),
        ([1.0, 0.0, -5.0], SamplingParams(1.0, min_p=0.3), [0, 1]),
        # p = [.44, .16, .15, .13, .12]: top-p 0.7 first would keep 3, then top-k 2; top-k first
        # renormalizes the top 2 to [.73, .27], and top-p 0.7 then keeps token 0 alone
        ([0.0, -1.0, -1.1, -1.2, -1.3], SamplingParams(1.0, top_k=2, top_p=0.7), [0]),
    ],
)
def test_edge_cases(logits, params, expect):
    x = row(logits)
    ours, ref = target_probs(x, params), hf_probs(x, params)
    assert kept(ref) == expect  # the reference agrees with the hand computation
    assert kept(ours) == expect
    assert torch.allclose(ours.double(), ref, atol=1e-6)


@pytest.mark.parametrize("n,top_p", [(8, 0.25), (8, 0.5), (8, 0.375), (8, 0.875), (4, 0.5), (16, 0.0625)])
def test_top_p_boundary_ties(n, top_p):
    """Uniform rows (exact binary fractions): the mass before the boundary token equals top_p
    exactly. Both keep the smallest prefix reaching top_p, n * top_p tokens (which ones among the
    tied: see the module docstring), and renormalize it to uniform."""
    x = torch.zeros(1, n)
    params = SamplingParams(1.0, top_p=top_p)
    ours, ref = target_probs(x, params), hf_probs(x, params)
    assert len(kept(ours)) == len(kept(ref)) == round(n * top_p)
    assert torch.allclose(ours.double().sort().values, ref.sort().values)


def top_p_before_top_k(logits, params):
    """WRONG order: top-p on the full distribution, then top-k."""
    p = target_probs(logits, SamplingParams(params.temperature, 0, params.top_p, 0.0))
    return target_probs(p.log(), SamplingParams(1.0, params.top_k, 1.0, params.min_p))


def min_p_before_temperature(logits, params):
    """WRONG order: min-p on the raw logits, then the temperature and the rest."""
    raw = torch.softmax(logits.float(), -1)
    cut = logits.masked_fill(raw < params.min_p * raw.amax(-1, keepdim=True), float("-inf"))
    return target_probs(cut, SamplingParams(params.temperature, params.top_k, params.top_p, 0.0))


def top_p_inclusive(logits, params):
    """WRONG boundary: also keep the token whose preceding mass equals top_p exactly (`>` for `>=`)."""
    probs = target_probs(logits, SamplingParams(params.temperature, params.top_k, 1.0, 0.0))
    sp, order = probs.sort(-1, descending=True)
    before = sp.cumsum(-1) - sp
    drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before > params.top_p)
    probs = probs.masked_fill(drop, 0.0)
    return target_probs(probs.log(), SamplingParams(1.0, 0, 1.0, params.min_p))


def test_the_comparison_catches_wrong_samplers():
    """The grid is sharp enough to see an order swap; the boundary cases see an off-by-one."""
    for wrong in (top_p_before_top_k, min_p_before_temperature):
        bad, _, total = grid_mismatches(wrong)
        assert bad > total // 50, f"{wrong.__name__}: only {bad} of {total} rows differ"
    x, params = torch.zeros(1, 8), SamplingParams(1.0, top_p=0.5)
    assert len(kept(top_p_inclusive(x, params))) == 5 != len(kept(hf_probs(x, params)))
