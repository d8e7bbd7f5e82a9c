"""`--budget auto`: the bandit (bandit.py) over draft-tree budgets, priced by measured step times.

    step_s(0) = t_verify(1)                       a plain decode step (the drafter does not run)
    step_s(b) = t_draft + t_verify(b + 1 nodes)   a drafted step of b nodes

- t_verify: the target's verify pass timed at 1 .. 65 nodes at the current context length
  (`measure_verify_times`, or the decoder's own runner: `runner_verify_timer`; cached per context bucket).
- t_draft: the (low) median of the drafter's last DRAFT_WINDOW propose times, each request's first left out (DFlash drafts all depths in
  one pass: it barely depends on b). Not a mean: one cold propose (a request's first pass runs eagerly
  over the prompt, a process's first may compile kernels) took 194 ms on the H200 against ~0.4 ms
  after, and a mean seeded with it priced every draft at 12-24 ms for dozens of steps.

`AutoBudget` belongs to one drafter: per request (`start_request`, at the drafter's reset) a fresh
BudgetBandit from the prior the earlier requests left, fed with the accepted path of every tree. A
device loop (device_step.py) drafts one budget in a captured graph: `start_device` gives it a bandit
of two arms, no drafting and that budget, with a prior of its own.
"""

from __future__ import annotations

import collections
import statistics
import time
import weakref
from dataclasses import replace
from typing import Callable

import torch

from treeflash.models.step import StepInput
from treeflash.spec.bandit import BanditConfig, BanditPrior, BudgetBandit

DRAFT_WINDOW = 50  # proposes whose median prices a draft
NODE_COUNTS = (1, 2, 3, 5, 9, 17, 33, 65)  # verify sizes timed: budgets 0, 1, 2, 4, 8, 16, 32, 64 plus the root
# On a CPU a verify pass costs ~0.1-0.4 s (SmolLM2, fp32), so the full table (27 passes) took 5.4-5.9 s per context
# bucket, more than a short `treeflash generate --draft dflash` answer saved (68 tokens in 7.2 s against
# 6.6 s plain). There the table stops at 33 nodes (time grows linearly with nodes on a CPU, which `interpolate`
# extrapolates) and takes the faster of 2 runs per size: the first run of a new shape pays one-time costs.
CPU_NODE_COUNTS = (1, 2, 3, 5, 9, 17, 33)
CPU_REPEATS = 2


def interpolate(times: dict[int, float], num_nodes: int) -> float:
    """Piecewise-linear in the node count between measured points; flat below, linear above."""
    xs = sorted(times)
    if num_nodes <= xs[0]:
        return times[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if num_nodes <= hi:
            return times[lo] + (times[hi] - times[lo]) * (num_nodes - lo) / (hi - lo)
    if len(xs) == 1:
        return times[xs[0]]
    lo, hi = xs[-2], xs[-1]
    return times[hi] + (times[hi] - times[lo]) * (num_nodes - hi) / (hi - lo)


def arms_within(config: BanditConfig, max_budget: int) -> BanditConfig:
    """The config with its arms cut at max_budget (max_budget itself an arm when a larger one was cut)."""
    arms = {a for a in config.arms if a <= max_budget}
    if max(config.arms) > max_budget:
        arms.add(max_budget)
    return replace(config, arms=tuple(sorted(arms)))


class AutoBudget:
    def __init__(self, max_budget: int, measure: Callable[[int], dict[int, float]], config: BanditConfig = BanditConfig()):
        """measure: context length -> {node count: verify seconds}."""
        self.max_budget, self.measure = max_budget, measure
        self.config = arms_within(config, max_budget)
        self.prior = BanditPrior(self.config)
        self.device_priors: dict[int, BanditPrior] = {}  # a device loop's budget -> its two-arm prior
        self.bandit: BudgetBandit | None = None
        self.draft_s = 0.0
        self._draft_times: collections.deque[float] = collections.deque(maxlen=DRAFT_WINDOW)
        self.budget = 0  # the last choice
        self.reason = "no request yet"

    def start_request(self) -> None:
        """A new request: the last one's evidence folds into the prior, a fresh bandit starts from it."""
        if self.bandit is not None and self.bandit.steps:
            self.prior.fold(self.bandit)
        self.bandit = self.prior.start()

    def step_times(self, context_len: int, limit: int) -> dict[int, float]:
        """arm -> seconds of a step at this context, for the arms <= limit."""
        times = self.measure(context_len)
        out = {0: interpolate(times, 1)}
        for a in self.config.arms:
            if 0 < a <= limit:
                out[a] = self.draft_s + interpolate(times, a + 1)
        return out

    def next_budget(self, context_len: int, limit: int) -> int:
        """The budget of the next tree (at most `limit` nodes; 0: a plain step)."""
        if self.bandit is None:
            self.start_request()
        step_s = self.step_times(context_len, limit)
        self.budget = self.bandit.choose(step_s)
        tau = self.bandit.expected_tau()
        name = "budget 0 (no drafting)" if self.budget == 0 else f"budget {self.budget}"
        self.reason = (f"{name}: {self.bandit.last[1]} (posterior tau " +
                       ", ".join(f"{a}: {tau[a]:.2f} at {step_s[a] * 1e3:.1f} ms" for a in sorted(step_s)) +
                       f"; step {self.bandit.steps}, request {self.prior.requests})")
        return self.budget

    def record(self, num_draft_nodes: int, accepted_nodes: list[int], draft_s: float | None) -> None:
        """num_draft_nodes: the verified tree's budget; accepted_nodes: its accepted node ids (root excluded);
        draft_s: its propose time (None: a request's first, which also projects the prompt: not a step's)."""
        if self.bandit is not None:
            self.bandit.observe(num_draft_nodes, accepted_nodes)
        if draft_s is not None:
            self._draft_times.append(draft_s)
            self.draft_s = statistics.median_low(self._draft_times)

    def record_plain(self) -> None:
        if self.bandit is not None:
            self.bandit.observe_plain()

    def start_device(self, budget: int, last: BudgetBandit | None) -> BudgetBandit:
        """A device loop's bandit for a new request: arms 0 and `budget`; `last`: its previous one, folded."""
        prior = self.device_priors.get(budget)
        if prior is None:
            prior = self.device_priors[budget] = BanditPrior(replace(self.config, arms=(0, budget)))
        if last is not None and last.steps:
            prior.fold(last)
        return prior.start()


# -- timing the target's verify pass --------------------------------------------------------------

# Measurements cost a few target passes, so they are made once per process, model and context
# bucket (a deliberate per-process cache; it dies with the model).
_TIMES: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, dict[int, float]]]" = weakref.WeakKeyDictionary()


def context_bucket(context_len: int) -> int:
    """The power of two >= context_len (at least 128): timings are measured there."""
    return 1 << max(7, (max(context_len, 1) - 1).bit_length())


def measure_verify_times(target, context_len: int, node_counts: tuple[int, ...] | None = None,
                         repeats: int | None = None) -> dict[int, float]:
    """{node count: seconds of one verify pass} at context_len's bucket, cached per process: the median of 3
    runs per size of NODE_COUNTS, or on a CPU (None: the defaults) the faster of CPU_REPEATS runs of CPU_NODE_COUNTS."""
    bucket = context_bucket(context_len)
    per_model = _TIMES.setdefault(target, {})
    if bucket not in per_model:
        cpu = target.device.type == "cpu"
        counts = node_counts or (CPU_NODE_COUNTS if cpu else NODE_COUNTS)
        per_model[bucket] = _time_verify(target, bucket, counts, repeats or (CPU_REPEATS if cpu else 3), fastest=cpu)
    return per_model[bucket]


@torch.inference_mode()
def _time_verify(target, context_len: int, node_counts: tuple[int, ...], repeats: int, fastest: bool = False) -> dict[int, float]:
    cache = target.new_cache(context_len + max(node_counts))
    # Timing only: the committed prefix is zeros, which costs attention exactly what real keys do.
    cache.seq_len = context_len
    device = target.device

    def verify(n: int) -> None:
        ids = torch.randint(0, target.config.vocab_size, (n,), device=device)
        target(StepInput.chain(ids, context_len), cache, compute_logits=True)
        cache.pending = 0  # drop the uncommitted nodes

    return _median_times(verify, node_counts, repeats, device, fastest)


def _median_times(verify: Callable[[int], None], node_counts: tuple[int, ...], repeats: int, device: torch.device,
                  fastest: bool = False) -> dict[int, float]:
    """{n: median seconds of verify(n)} over `repeats` runs each (fastest: the minimum); a first pass at
    the largest n warms up."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[int, float] = {}
    for n in (max(node_counts), *node_counts):
        samples = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            verify(n)
            sync()
            samples.append(time.perf_counter() - t0)
        out[n] = min(samples) if fastest else sorted(samples)[len(samples) // 2]
    return out


def runner_verify_timer(runner, node_counts: tuple[int, ...] = NODE_COUNTS, repeats: int = 3) -> Callable[[int], dict[int, float]]:
    """A `measure` for AutoBudget that times the verify pass the decoder really runs: the runner's
    (CUDA graphs on a GPU, where an eager pass would be host-bound and mislead the choice), on the
    live cache at its current length. The timed nodes are never committed; cached per context bucket."""
    cache_times: dict[int, dict[int, float]] = {}

    @torch.inference_mode()
    def measure(context_len: int) -> dict[int, float]:
        bucket = context_bucket(context_len)
        if bucket not in cache_times:
            cache = runner.cache
            start = cache.seq_len

            def verify(n: int) -> None:
                ids = torch.randint(0, runner.model.config.vocab_size, (n,))
                runner.forward(StepInput.chain(ids, start), capture_layers=getattr(runner, "capture_layers", ()))
                runner.abandon()  # drop the uncommitted nodes: the committed cache is untouched

            fits = tuple(n for n in node_counts if n <= cache.max_len - start)
            cache_times[bucket] = _median_times(verify, fits, repeats, runner.model.device) if fits else {}
        return cache_times[bucket]

    return measure
