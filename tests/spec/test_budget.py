"""`--budget auto`'s AutoBudget: step prices from measured verify and draft times, one bandit per
request, a prior across requests (the policy itself: tests/spec/test_bandit.py)."""

import pytest

from treeflash.spec.bandit import BanditConfig
from treeflash.spec.budget import AutoBudget, arms_within, context_bucket, interpolate, measure_verify_times


def linear_times(fixed: float, per_node: float) -> dict[int, float]:
    return {n: fixed + per_node * n for n in (1, 2, 3, 5, 9, 17, 33, 65)}


def test_interpolate():
    times = {1: 1.0, 3: 2.0, 9: 5.0}
    assert interpolate(times, 1) == 1.0 and interpolate(times, 0) == 1.0
    assert interpolate(times, 2) == pytest.approx(1.5)
    assert interpolate(times, 6) == pytest.approx(3.5)
    assert interpolate(times, 15) == pytest.approx(8.0)  # extrapolated along the last segment


def test_step_prices_come_from_the_verify_table_and_the_draft_median():
    auto = AutoBudget(64, lambda n: linear_times(0.010, 0.001))
    auto.record(8, [1], draft_s=0.004)
    step_s = auto.step_times(100, limit=20)
    assert set(step_s) == {0, 4, 8, 16}  # arms above the limit (the room left in the cache) are not offered
    assert step_s[0] == pytest.approx(0.011)  # a plain step: a one-node verify, no draft
    assert step_s[16] == pytest.approx(0.004 + 0.010 + 0.001 * 17)


def test_arms_are_cut_at_the_drafters_limit():
    assert arms_within(BanditConfig(), 15).arms == (0, 4, 8, 15)  # a DFlash chain drafts at most 15
    assert arms_within(BanditConfig(), 64).arms == BanditConfig().arms


def test_one_cold_propose_does_not_price_every_draft():
    """A cold propose (a first kernel compile, or a request's first pass over its prompt, which the drafter
    leaves out itself) can take 100x a steady one: the draft cost is the low median of recent proposes,
    so one outlier leaves the policy drafting (a mean priced drafts at 24 ms on the H200 and chose plain)."""
    auto = AutoBudget(64, lambda n: linear_times(0.0005, 0.00001))
    auto.start_request()
    chosen = []
    for step in range(40):
        b = auto.next_budget(100, limit=64)
        chosen.append(b)
        if b:
            auto.record(b, list(range(1, min(b, 6) + 1)), draft_s=0.2 if step == 0 else 0.0004)
        else:
            auto.record_plain()
    assert abs(auto.draft_s - 0.0004) < 1e-9
    # priced at 0.2 s after the cold one, the next draft is the floor's next probe (the first doubled the
    # interval); from there the median is right
    assert all(chosen[2 * auto.config.probe_every + 2 :]), (chosen, auto.reason)
    assert "posterior tau" in auto.reason


def test_requests_start_from_the_prior_the_last_one_left():
    auto = AutoBudget(64, lambda n: linear_times(0.001, 0.00001))
    auto.start_request()
    for _ in range(30):
        b = auto.next_budget(100, limit=64)
        auto.record(b, list(range(1, min(b, 5) + 1)), draft_s=0.0005) if b else auto.record_plain()
    auto.start_request()
    assert auto.prior.requests == 1 and auto.bandit.steps == 0
    assert auto.bandit.prior[4][0] == pytest.approx(4.0)  # the first arm's gain: 4 accepted drafts at budget 4


def test_measure_verify_times_is_cached_per_bucket():
    from tests.models.hf_oracle import make_pair

    _, model = make_pair("qwen3")
    times = measure_verify_times(model, 100, node_counts=(1, 4), repeats=1)
    assert set(times) == {1, 4} and all(t > 0 for t in times.values())
    assert measure_verify_times(model, 120, node_counts=(1, 4), repeats=1) is times  # same bucket: cached
    assert context_bucket(100) == context_bucket(128) == 128 and context_bucket(129) == 256


def test_cpu_verify_table_is_short():
    """On a CPU the table stops at 33 nodes and takes the faster of 2 runs (budget.CPU_NODE_COUNTS: the full
    8-size median-of-3 table cost more than a short drafted answer saved); larger budgets extrapolate."""
    from tests.models.hf_oracle import make_pair
    from treeflash.spec import budget

    _, model = make_pair("llama")
    calls = []
    real = budget._median_times

    def counted(verify, node_counts, repeats, device, fastest=False):
        calls.append((node_counts, repeats, fastest))
        return real(verify, node_counts, repeats, device, fastest)

    budget._median_times = counted
    try:
        times = measure_verify_times(model, 3000)
    finally:
        budget._median_times = real
    assert calls == [(budget.CPU_NODE_COUNTS, budget.CPU_REPEATS, True)]
    assert set(times) == set(budget.CPU_NODE_COUNTS) and max(times) == 33


