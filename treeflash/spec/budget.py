"""`--budget auto`: pick the draft-tree budget that maximizes committed tokens per second here.

    rate(b) = (1 + E[accepted | b]) / (t_draft + t_verify(b + 1 nodes)),   rate(0) = 1 / t_verify(1)

Budget 0 means "do not draft": the step is a plain one-token decode and the drafter does not run
(its context rows wait and are projected in one go at the next draft). It wins when the drafter
is too weak for this machine, so `--budget auto` is never much slower than plain decoding.

- t_verify: the target's verify pass timed at 1 .. 65 nodes at the current context length
  (`measure_verify_times`; cached per process and per context-length bucket).
- E[accepted | b]: from the trees verified so far. Node r of a tree (r >= 1, in tree order) is
  accepted with probability P_r; since the tree of budget b is the first b nodes of any larger
  tree (ddtree.py), accepted(b) = #{accepted nodes r <= b} and E[accepted | b] = sum_{r<=b} P_r.
  `AcceptanceByRank` estimates P_r with exponentially decayed counts, so it follows drift.
- t_draft: the drafter's mean propose time (DFlash drafts all depths in one pass: it barely
  depends on b).

`BudgetTuner` explores for a few warm-up steps at the probe budget (the largest tree whose
verify costs at most 2 one-token steps here: all of the 64 on a memory-bound GPU, ~8 on a CPU),
then revises its choice every `revise_every` steps; the last step of each period probes at the
probe budget again so that the statistics of ranks above the current choice stay fresh. While
budget 0 (no drafting) keeps winning, the period doubles (up to 16x), so a weak drafter costs
little more than plain decoding.
"""

from __future__ import annotations

import collections
import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from treeflash.models.step import StepInput

DRAFT_WINDOW = 50  # proposes whose median prices a draft
NODE_COUNTS = (1, 2, 3, 5, 9, 17, 33, 65)  # verify sizes timed: budgets 0, 1, 2, 4, 8, 16, 32, 64 plus the root
# On a CPU a verify pass costs ~0.1-0.4 s (SmolLM2, fp32), so the full table (27 passes) took 5.4-5.9 s per context
# bucket, more than a short `treeflash generate --draft dflash` answer saved (stop 27: 68 tokens in 7.2 s against
# 6.6 s plain). There the table stops at 33 nodes (time grows linearly with nodes on a CPU, which `interpolate`
# extrapolates) and takes the faster of 2 runs per size: the first run of a new shape pays one-time costs.
CPU_NODE_COUNTS = (1, 2, 3, 5, 9, 17, 33)
CPU_REPEATS = 2


@dataclass
class AcceptanceByRank:
    decay: float = 0.998  # per recorded tree; ~500 trees of memory
    held: list[float] = field(default_factory=list)  # [rank-1]: decayed count of trees that held node `rank`
    accepted: list[float] = field(default_factory=list)  # [rank-1]: ... of those that accepted it

    def record(self, num_draft_nodes: int, accepted_nodes: list[int]) -> None:
        """num_draft_nodes: the verified tree's budget; accepted_nodes: its accepted node ids (root excluded)."""
        self.held = [h * self.decay for h in self.held]
        self.accepted = [a * self.decay for a in self.accepted]
        while len(self.held) < num_draft_nodes:
            self.held.append(0.0)
            self.accepted.append(0.0)
        for r in range(num_draft_nodes):
            self.held[r] += 1.0
        for node in accepted_nodes:
            self.accepted[node - 1] += 1.0

    def expected_accepted(self, max_budget: int) -> list[float]:
        """[max_budget + 1]: E[accepted | b] for b = 0 .. max_budget (ranks never held count 0)."""
        out = [0.0]
        for r in range(max_budget):
            p = self.accepted[r] / self.held[r] if r < len(self.held) and self.held[r] > 0 else 0.0
            out.append(out[-1] + p)
        return out


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


@dataclass(frozen=True)
class BudgetChoice:
    budget: int
    tokens_per_s: float  # estimated committed tokens per second at `budget`
    expected_accepted: float  # E[accepted | budget]
    verify_s: float  # t_verify(budget + 1)
    draft_s: float
    plain_tokens_per_s: float  # 1 / t_verify(1): plain decoding, for comparison

    def reason(self) -> str:
        if self.budget == 0:
            return (f"budget 0 (no drafting) is fastest: plain decoding est. {self.tokens_per_s:.1f} tok/s beats every "
                    f"budget with the acceptance seen so far (a draft costs {self.draft_s * 1e3:.1f} ms)")
        return (
            f"budget {self.budget} maximizes est. (1 + {self.expected_accepted:.2f} accepted) / "
            f"({self.draft_s * 1e3:.1f} ms draft + {self.verify_s * 1e3:.1f} ms verify) = {self.tokens_per_s:.1f} tok/s "
            f"(plain decoding est. {self.plain_tokens_per_s:.1f} tok/s)"
        )


def choose_budget(expected_accepted: list[float], verify_times: dict[int, float], draft_s: float, max_budget: int) -> BudgetChoice:
    """expected_accepted[b] = E[accepted | b]; verify_times: node count -> seconds."""
    best = None
    for b in range(0, min(max_budget, len(expected_accepted) - 1) + 1):
        t_verify = interpolate(verify_times, b + 1)
        rate = (1.0 + expected_accepted[b]) / max((draft_s if b else 0.0) + t_verify, 1e-9)
        if best is None or rate > best.tokens_per_s * (1 + 1e-9):  # ties keep the smaller budget
            best = BudgetChoice(b, rate, expected_accepted[b], t_verify, draft_s, 1.0 / max(interpolate(verify_times, 1), 1e-9))
    assert best is not None
    return best


class BudgetTuner:
    def __init__(
        self,
        max_budget: int,
        measure: Callable[[int], dict[int, float]],  # context length -> {node count: verify seconds}
        revise_every: int = 32,
        warmup: int = 8,
        decay: float = 0.998,
        probe_cost: float = 2.0,
    ):
        self.max_budget, self.measure = max_budget, measure
        self.revise_every, self.warmup, self.probe_cost = revise_every, warmup, probe_cost
        self.stats = AcceptanceByRank(decay)
        # the drafter's propose time: the median of the last DRAFT_WINDOW proposes. Not a mean: one cold
        # propose (a request's first pass runs eagerly over the prompt, and a process's first one may
        # compile kernels) took 194 ms on the H200 against ~0.4 ms after (bench/results/s23/
        # draft_time_probe.json), and a running mean seeded with it priced every draft at 12-24 ms
        # for dozens of steps, so `--budget auto` chose plain decoding
        self.draft_s = 0.0
        self._draft_times: collections.deque[float] = collections.deque(maxlen=DRAFT_WINDOW)
        self.steps = 0
        self.period = revise_every  # steps between revisions: doubles while budget 0 keeps winning
        self.next_revision = warmup + 1
        self.probe_budget: int | None = None  # warm-up and probe trees: see probe_budget_for
        self.choice: BudgetChoice | None = None
        self.reason = f"warming up: the first {warmup} steps draft the largest tree whose verify costs <= {probe_cost}x a step"

    def probe_budget_for(self, times: dict[int, float]) -> int:
        """The largest budget whose verify costs at most `probe_cost` one-token steps (all of max_budget on a
        memory-bound GPU, ~8 on a CPU): warm-up and probe trees observe every rank worth choosing without
        making a probe cost many plain steps."""
        limit = self.probe_cost * interpolate(times, 1) * (1 + 1e-9)
        fits = [b for b in range(1, self.max_budget + 1) if interpolate(times, b + 1) <= limit]
        return max(fits or [1])

    def next_budget(self, context_len: int) -> int:
        """The budget of the next tree; revises the choice when a period ends."""
        self.steps += 1
        if self.probe_budget is None:
            self.probe_budget = self.probe_budget_for(self.measure(context_len))
        if self.steps <= self.warmup:
            return self.probe_budget
        if self.steps == self.next_revision:
            self.revise(context_len)
            self.period = min(self.period * 2, 16 * self.revise_every) if self.choice.budget == 0 else self.revise_every
            self.next_revision = self.steps + self.period
        if self.steps == self.next_revision - 1:
            return max(self.probe_budget, self.choice.budget)  # a probe: keeps the statistics of higher ranks current
        assert self.choice is not None
        return self.choice.budget

    def record(self, num_draft_nodes: int, accepted_nodes: list[int], draft_s: float) -> None:
        self.stats.record(num_draft_nodes, accepted_nodes)
        self._draft_times.append(draft_s)
        self.draft_s = statistics.median(self._draft_times)

    def revise(self, context_len: int) -> BudgetChoice:
        times = self.measure(context_len)
        self.probe_budget = self.probe_budget_for(times)
        self.choice = choose_budget(self.stats.expected_accepted(self.max_budget), times, self.draft_s, self.max_budget)
        self.reason = self.choice.reason() + f"; revised at context {context_len}, probes draft {self.probe_budget} nodes"
        return self.choice

    @property
    def budget(self) -> int:
        return self.choice.budget if self.choice is not None else (self.probe_budget or self.max_budget)


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
    """A `measure` for BudgetTuner that times the verify pass the decoder really runs: the runner's
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
