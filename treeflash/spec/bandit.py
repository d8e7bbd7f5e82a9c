"""`--budget auto`'s policy: a discounted Thompson-sampling bandit over draft-tree budgets, per request.

Vocabulary. An *arm* is a budget b (draft nodes per step; b = 0 is no drafting: a plain decode step).
A *step* at arm b commits `accepted + 1` tokens in `step_s[b]` seconds; the reward is their ratio,
tokens per second. Step times are the caller's model (measured verify and draft times, budget.py);
what the bandit learns is tau_b = E[accepted + 1 | b] per arm, the part that changes with the text.

- Model: over the sorted arms a_0 = 0 < a_1 < ..., tau(a_0) = 1 and tau(a_k) = tau(a_(k-1)) + gain_k,
  each gain >= 0 (a larger tree holds the smaller one) with a normal posterior.
- Side observations: the tree of budget b is the first b nodes of any larger tree (ddtree.py), so a
  step at budget B also shows what every arm b <= B would have committed: 1 + #{accepted node ids <= b}
  (exact for greedy and sample-and-match walks; an estimate under recursive rejection), hence every
  gain up to B.
- Within a request: each observation of a gain first discounts that gain's evidence by `discount`
  (about 1 / (1 - discount) observations weigh), and every step fades all evidence by `stale`, so an
  arm left alone widens back to its prior, and the choice follows acceptance that changes mid-request.
- Choice (Thompson sampling): draw every gain once from its posterior (the prior's pseudo-steps plus
  the evidence; per-step variance at least `min_var`), sum them into a drawn tau per arm (nested arms
  share their draws, as their evidence shares its steps), take the arm of the highest tau / step_s.
- Floor: when no step drafted at least the probe arm (the largest arm above the current choice whose
  step costs at most `probe_cost` of the current choice's steps, of the cheapest tree's when the
  choice is plain decoding; else the next one up) for
  `probe_every` steps, the next step probes there. Each forced probe doubles the interval, up to
  `max_probe_every`; a probe that beats the plain decoding it displaced sets it to 1 (probe again,
  until the posterior follows), and a choice that moves up to the probed arm resets it to
  `probe_every`. So drafting off costs about one probe per `max_probe_every` steps and comes back
  within that many after acceptance does; a small tree does not absorb either: the probes climb from it.
- Across requests, only a prior: per gain, the totals of every request's observations, decayed by
  `prior_decay` per request, enter the next request as at most `prior_steps` pseudo-steps (and the
  last probe interval). No request starts locked out: its first step is a probe.

Pure and deterministic given `BanditConfig.seed` and the order of requests (no clocks, no globals).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from treeflash.errors import InvalidRequestError


@dataclass(frozen=True)
class BanditConfig:
    arms: tuple[int, ...] = (0, 4, 8, 16, 32, 48, 64)  # budgets; 0 = plain decoding
    discount: float = 0.9  # per observation of an arm: its last ~10 steps weigh
    stale: float = 0.995  # per step, every arm: evidence not renewed fades (over ~200 steps)
    probe_cost: float = 2.0  # the probe arm: the largest above the current choice costing <= this many of its steps
    probe_every: int = 16  # a probe after this many steps without one (the floor on exploration)
    max_probe_every: int = 128  # ... doubling while probes lose, up to this
    prior_steps: float = 1.0  # the cross-request prior weighs at most this many steps
    prior_decay: float = 0.5  # per request: the weight the earlier requests keep in the prior
    default_tau: float = 1.5  # never observed: tau of the first drafting arm ~ N(default_tau, default_var) ...
    default_gain: float = 0.25  # ... and each larger arm's gain over the next smaller ~ N(default_gain, default_var),
    default_var: float = 0.25
    default_steps: float = 0.5  # ... weighing this many steps
    min_var: float = 0.04  # a floor on each gain's per-step variance
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.arms or 0 not in self.arms or any(a < 0 for a in self.arms) or len(set(self.arms)) != len(self.arms):
            raise InvalidRequestError(f"bandit arms must be distinct budgets >= 0 including 0, got {self.arms}", "budget")
        if not (0.0 < self.discount < 1.0 and 0.0 < self.stale <= 1.0):
            raise InvalidRequestError(f"bandit: discount in (0, 1), stale in (0, 1]; got {self.discount}, {self.stale}", "budget")
        if not 1 <= self.probe_every <= self.max_probe_every:
            raise InvalidRequestError("bandit probes: need 1 <= probe_every <= max_probe_every", "budget")
        if self.probe_cost < 1.0 or self.prior_steps < 0 or not 0.0 <= self.prior_decay <= 1.0:
            raise InvalidRequestError("bandit: probe_cost >= 1, prior_steps >= 0, prior_decay in [0, 1]", "budget")
        if self.default_tau < 1.0 or self.default_gain < 0 or self.default_var <= 0 or self.default_steps <= 0 or self.min_var <= 0:
            raise InvalidRequestError("bandit: default_tau >= 1; default_var, default_steps, min_var > 0", "budget")


@dataclass
class Moments:
    """Weighted count, sum and sum of squares of one arm's committed tokens per step."""

    n: float = 0.0
    s: float = 0.0
    q: float = 0.0

    def add(self, x: float, w: float = 1.0) -> None:
        self.n += w
        self.s += w * x
        self.q += w * x * x

    def scale(self, f: float) -> None:
        self.n, self.s, self.q = self.n * f, self.s * f, self.q * f


@dataclass
class BanditPrior:
    """What one request leaves to the next: decayed totals per increment and the probe interval (the only
    cross-request state)."""

    config: BanditConfig
    totals: dict[int, Moments] = field(default_factory=dict)  # arm -> decayed totals of its increment
    requests: int = 0
    interval: int = 0  # the probe interval the last request ended with (0: none yet)

    def fold(self, request: "BudgetBandit") -> None:
        for arm, r in request.totals.items():
            m = self.totals.setdefault(arm, Moments())
            m.scale(self.config.prior_decay)
            m.n, m.s, m.q = m.n + r.n, m.s + r.s, m.q + r.q
        self.interval = request.interval
        self.requests += 1

    def start(self, arms: tuple[int, ...] | None = None) -> "BudgetBandit":
        """A new request's bandit over `arms` (default: the config's), seeded by the config's seed and the
        request's index. Its prior per increment: the earlier requests' mean and variance, weighing at
        most prior_steps steps; never observed: default_tau (the first arm) or default_gain."""
        c = self.config
        arms = tuple(sorted(arms or c.arms))
        prior = {}
        for k, arm in enumerate(arms[1:]):
            m = self.totals.get(arm)
            if m is None or m.n <= 0:
                prior[arm] = ((c.default_tau - 1.0) if k == 0 else c.default_gain, c.default_var, c.default_steps)
            else:
                mean = m.s / m.n
                prior[arm] = (mean, max(m.q / m.n - mean * mean, c.min_var), min(m.n, c.prior_steps))
        return BudgetBandit(c, arms, prior, random.Random(c.seed * 1_000_003 + self.requests), self.interval or c.probe_every)


class BudgetBandit:
    """One request's policy. `choose(step_s)` -> the next step's arm; then `observe` (a drafted step:
    its budget and accepted node ids), `observe_count` (a step at the first drafting arm seen only by
    how many it accepted) or `observe_plain`.

    The model: tau(a_0 = 0) = 1 and tau(a_k) = tau(a_(k-1)) + gain(a_k) over the sorted arms; each
    gain >= 0 has a normal posterior (a larger tree holds the smaller one), and a choice draws every
    gain once, so the drawn tau of nested arms share their draws as their evidence shares its steps."""

    def __init__(self, config: BanditConfig, arms: tuple[int, ...], prior: dict[int, tuple[float, float, float]],
                 rng: random.Random, interval: int | None = None):
        self.config, self.arms, self.prior, self.rng = config, arms, prior, rng  # prior: arm -> (mean gain, variance, steps)
        self.recent = {a: Moments() for a in arms[1:]}  # discounted evidence of each gain in this request
        self.totals = {a: Moments() for a in arms[1:]}  # undiscounted: what the prior keeps
        self.interval = interval or config.probe_every  # forced probes come after this many steps without one
        self.since_probe = self.interval  # steps since one drafted at least the probe arm: the first step probes
        self.probe = 0  # the probe arm at the last choice
        self.bar = math.inf  # the tokens a forced probe needs to beat the plain decoding it displaced
        self.steps = 0
        self.last: tuple[int, str] = (0, "")  # the last choice and why

    # -- choosing --
    def choose(self, step_s: dict[int, float]) -> int:
        """step_s: arm -> seconds of one step there, for the arms allowed now (arm 0 among them)."""
        if 0 not in step_s:
            raise ValueError("step_s must price arm 0 (plain decoding)")
        best, best_rate = 0, 1.0 / max(step_s[0], 1e-12)
        tau = 1.0
        for a in self.arms[1:]:
            tau += max(self.draw(a), 0.0)
            if a in step_s and tau / max(step_s[a], 1e-12) > best_rate:
                best, best_rate = a, tau / max(step_s[a], 1e-12)
        if best > 0 and best >= self.probe:  # the policy moved up to where it probed: probe often again
            self.interval = self.config.probe_every
        self.probe = self.probe_arm(step_s, best)
        if self.probe > best and self.since_probe >= self.interval:
            self.interval = min(2 * self.interval, self.config.max_probe_every)  # while probes lose, fewer
            # the tokens this probe must commit to beat plain decoding, when it displaced plain decoding
            self.bar = best_rate * step_s[self.probe] if best == 0 else math.inf
            self.last = (self.probe, f"probe after {self.since_probe} steps without one")
            return self.probe
        self.last = (best, f"Thompson draw: {best_rate:.1f} tok/s")
        return best

    def probe_arm(self, step_s: dict[int, float], best: int) -> int:
        """The arm a forced probe drafts, above `best` (0 when best is the largest): the largest costing at
        most probe_cost steps of `best` (best = 0: of the cheapest drafting arm), else the next one up."""
        above = sorted(a for a in step_s if a > best and a in self.recent)
        if not above:
            return 0
        unit = step_s[best] if best else step_s[above[0]]
        fits = [a for a in above if step_s[a] <= self.config.probe_cost * unit * (1 + 1e-9)]
        return fits[-1] if fits else above[0]

    def draw(self, arm: int) -> float:
        mean, var, n = self.posterior(arm)
        return self.rng.gauss(mean, math.sqrt(var / n))

    def posterior(self, arm: int) -> tuple[float, float, float]:
        """(mean, per-step variance, weight in steps) of one arm's gain: prior pseudo-steps plus evidence."""
        p_mean, p_var, p_n = self.prior[arm]
        r = self.recent[arm]
        n = p_n + r.n
        mean = (p_n * p_mean + r.s) / n
        second = (p_n * (p_var + p_mean * p_mean) + r.q) / n
        return mean, max(second - mean * mean, self.config.min_var), n

    def expected_tau(self) -> dict[int, float]:
        """arm -> posterior mean of tau (for reports, not for choosing)."""
        out, tau = {0: 1.0}, 1.0
        for a in self.arms[1:]:
            tau += max(self.posterior(a)[0], 0.0)
            out[a] = tau
        return out

    # -- observing --
    def observe(self, budget: int, accepted_ids: list[int]) -> None:
        """A drafted step of `budget` nodes whose accepted path holds `accepted_ids` (node ids, root
        excluded): what each arm <= budget would have committed, as gains."""
        self._tick(budget)
        if self.last[0] == budget and self.last[1].startswith("probe") and 1 + len(accepted_ids) > self.bar:
            self.interval = 1  # a probe that beat plain decoding: probe again next step, backing off once they lose
        below = 1.0
        for a in self.arms[1:]:
            if a > budget:
                break
            tokens = 1.0 + sum(1 for i in accepted_ids if i <= a)
            self._add(a, tokens - below)
            below = tokens

    def observe_count(self, budget: int, accepted: int) -> None:
        """A step at the first drafting arm seen only by its accepted count (a device step)."""
        if len(self.arms) < 2 or budget != self.arms[1]:
            raise ValueError(f"observe_count is for the first drafting arm ({self.arms[1:2]}), got {budget}")
        self._tick(budget)
        self._add(budget, float(accepted))

    def observe_plain(self) -> None:
        self._tick(0)

    def _tick(self, budget: int) -> None:
        self.steps += 1
        for m in self.recent.values():
            m.scale(self.config.stale)
        self.since_probe = 0 if 0 < self.probe <= budget else self.since_probe + 1  # (a step at the probe arm or above)

    def _add(self, arm: int, gain: float) -> None:
        self.recent[arm].scale(self.config.discount)
        self.recent[arm].add(gain)
        self.totals[arm].add(gain)
