"""`--budget auto`: the choice logic on synthetic timings and acceptance."""

import pytest

from treeflash.spec.budget import AcceptanceByRank, BudgetTuner, choose_budget, context_bucket, interpolate, measure_verify_times




def linear_times(fixed: float, per_node: float) -> dict[int, float]:
    return {n: fixed + per_node * n for n in (1, 2, 3, 5, 9, 17, 33, 65)}


def geometric(p: float, max_budget: int) -> list[float]:
    """E[accepted | b] when node r is accepted with probability p**r (a chain-like tree)."""
    out = [0.0]
    for r in range(1, max_budget + 1):
        out.append(out[-1] + p**r)
    return out


def brute_force(expected, times, draft_s, max_budget) -> int:
    rates = {b: (1 + expected[b]) / ((draft_s if b else 0.0) + interpolate(times, b + 1)) for b in range(0, max_budget + 1)}
    return max(rates, key=lambda b: (rates[b], -b))


def test_interpolate():
    times = {1: 1.0, 3: 2.0, 9: 5.0}
    assert interpolate(times, 1) == 1.0 and interpolate(times, 0) == 1.0
    assert interpolate(times, 2) == pytest.approx(1.5)
    assert interpolate(times, 6) == pytest.approx(3.5)
    assert interpolate(times, 15) == pytest.approx(8.0)  # extrapolated along the last segment


@pytest.mark.parametrize(
    "p, fixed, per_node, expect",
    [
        (0.9, 0.020, 0.0001, "large"),  # memory-bound GPU: extra nodes are nearly free -> big tree
        (0.3, 0.010, 0.0010, "small"),  # compute-bound: each node costs 10% of a pass -> tiny tree
    ],
)
def test_choice_follows_the_tradeoff(p, fixed, per_node, expect):
    expected, times = geometric(p, 64), linear_times(fixed, per_node)
    choice = choose_budget(expected, times, draft_s=0.002, max_budget=64)
    assert choice.budget == brute_force(expected, times, 0.002, 64)
    assert (choice.budget >= 20) if expect == "large" else (choice.budget <= 3)
    assert choice.tokens_per_s == pytest.approx((1 + expected[choice.budget]) / (0.002 + fixed + per_node * (choice.budget + 1)))
    assert f"budget {choice.budget}" in choice.reason()


def test_a_weak_drafter_gets_budget_zero():
    """Little acceptance on a compute-bound machine (a CPU: 8 nodes cost 2x one): not drafting at
    all (budget 0: a plain step, no draft pass) beats every tree, and the reason says so."""
    times = {n: 0.070 * (1 + (n - 1) / 7) for n in (1, 2, 3, 5, 9, 17, 33, 65)}
    choice = choose_budget(geometric(0.3, 64), times, draft_s=0.045, max_budget=64)
    assert choice.budget == 0 and choice.tokens_per_s == pytest.approx(1 / 0.070)
    assert "budget 0 (no drafting)" in choice.reason()
    good = choose_budget(geometric(0.9, 64), times, draft_s=0.005, max_budget=64)  # a strong, cheap drafter still drafts
    assert good.budget > 0


def test_choice_with_a_knee_in_verify_time():
    """Verify time flat up to 17 nodes, then steep (a GPU tile boundary): the choice stops at the knee."""
    times = {1: 0.010, 2: 0.010, 3: 0.010, 5: 0.010, 9: 0.010, 17: 0.010, 33: 0.030, 65: 0.060}
    choice = choose_budget(geometric(0.8, 64), times, draft_s=0.001, max_budget=64)
    assert choice.budget == 16


def test_acceptance_by_rank_reads_smaller_budgets_off_larger_trees():
    stats = AcceptanceByRank(decay=1.0)
    stats.record(8, [1, 3])  # accepted nodes 1 and 3: a budget-2 tree would have accepted 1, budget-3 two
    stats.record(8, [])
    stats.record(4, [2])
    e = stats.expected_accepted(10)
    assert e[0] == 0.0
    assert e[1] == pytest.approx(1 / 3)
    assert e[2] == pytest.approx(1 / 3 + 1 / 3)
    assert e[3] == pytest.approx(1 / 3 + 1 / 3 + 1 / 3)
    assert e[8] == pytest.approx(1.0) and e[10] == pytest.approx(1.0)  # ranks never held count 0


def test_decay_follows_drift():
    stats = AcceptanceByRank(decay=0.9)
    for _ in range(100):
        stats.record(1, [1])
    for _ in range(100):
        stats.record(1, [])
    assert stats.expected_accepted(1)[1] < 0.01


def test_tuner_warms_up_then_revises_and_probes():
    calls = []

    def measure(context_len):
        calls.append(context_len)
        return linear_times(0.010, 0.0010)  # a compute-bound machine: 12 nodes cost 2 one-node steps

    tuner = BudgetTuner(max_budget=64, measure=measure, revise_every=10, warmup=5)
    budgets = []
    for step in range(40):
        b = tuner.next_budget(100 + step)
        budgets.append(b)
        accepted = [r for r in range(1, min(b, 3) + 1)] if step % 2 else []  # ranks 1..3 are accepted half the time
        tuner.record(b, accepted, draft_s=0.001)
    assert tuner.probe_budget == 11  # the largest tree whose verify costs <= 2 steps
    assert budgets[:5] == [11] * 5  # warm-up explores at the probe budget
    assert calls[:2] == [100, 105]  # timed at the first step (for the probe budget), revised after warm-up
    assert len(calls) == 5  # then every 10 steps
    assert budgets[5 + 9] == 11 and budgets[5 + 19] == 11  # one probe per period
    assert budgets[6] == tuner.budget == 3  # ranks above 3 are never accepted: no point verifying them
    assert "budget 3" in tuner.reason


def test_probe_budget_is_everything_on_a_memory_bound_gpu():
    tuner = BudgetTuner(max_budget=64, measure=lambda n: linear_times(0.020, 0.0001))
    assert tuner.next_budget(100) == 64


def test_tuner_backs_off_while_no_drafting_wins():
    """A drafter that is never right: budget 0 wins, and revisions (each with one probe) come
    every 20, 40, 80, 160 ... steps (the period doubles at each revision that keeps 0), so probes
    cost less and less."""
    tuner = BudgetTuner(max_budget=64, measure=lambda n: linear_times(0.010, 0.0010), revise_every=10, warmup=4)
    budgets = []
    for step in range(400):
        b = tuner.next_budget(100)
        budgets.append(b)
        if b:
            tuner.record(b, [], draft_s=0.005)
    assert tuner.budget == 0 and "no drafting" in tuner.reason
    probes = [i for i, b in enumerate(budgets) if b and i >= 4]
    assert probes == [23, 63, 143, 303]  # one step before each revision: steps 25, 65, 145, 305 (1-based)
    assert sum(1 for b in budgets if b) < 12  # 4 warm-up trees + a handful of probes in 400 steps


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


def test_one_cold_propose_does_not_price_every_draft():
    """A request's first propose (the prompt's eager pass, or a first kernel compile) can take 100x a
    steady one: the draft cost is the median of recent proposes, so one such outlier leaves the
    tuner drafting (a mean of the first steps priced drafts at 24 ms on the H200 and chose plain)."""
    tuner = BudgetTuner(max_budget=64, measure=lambda n: linear_times(0.0005, 0.00001), revise_every=10, warmup=4)
    for step in range(12):
        b = tuner.next_budget(100)
        tuner.record(b, list(range(1, min(b, 4) + 1)), draft_s=0.2 if step == 0 else 0.0004)
    assert abs(tuner.draft_s - 0.0004) < 1e-9
    assert tuner.budget > 0, tuner.reason
