"""DeviceLoop: the declared protocol of drafted steps that run on the device, one object owning them.

A synchronous speculative step reads back twice (the drafts, then the target's tokens); on a slow
host every read-back leaves the GPU idle. A drafter whose whole step (draft, verify, accept, commit)
can run on the device implements `Drafter.device_loop` and returns a DeviceLoop: one object that owns
the step's buffers and graphs, writes the runner's static inputs through their named views
(`CudaGraphRunner.static_inputs`, `run_static`, `stage_commit`, `commit_static`) and keeps its own
books. The Decoder drives every loop the same way:

    ready(seq_len, max_len)    whether the loop can start now (the drafter's state fits one step)
    start(root, seq_len, ...)  load the state: the drafter hands its own over
    enqueue() -> PendingStep   replay one step; the host enqueues step k + 1 before reading step k
    room(seq_len, max_len)     whether another step fits after the one in flight
    read(pending) -> StepRead  wait for that step; the loop advances its own books
    stop(observed)             no step in flight: the drafter takes its state back

and, for a drafter whose budget is tuned (`guarded`), the guard that turns drafting off for a
request whose device steps lose to plain decoding: `plain_time`, `skip_request`, `record`.
Tokens are those of the synchronous steps (greedy) or the same distribution (sampled): a loop is an
implementation of the same step, checked against the target alone (tests/spec/test_device_loop.py
shows a minimal one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

@dataclass(frozen=True)
class GuardTuning:
    """--budget auto's guard against plain decoding (a `guarded` loop; the Decoder applies it).

    Within a request: after `check_steps` device steps, a request whose device steps commit tokens
    slower than plain decoding would decodes plainly from there (synchronous drafting, the same drafts
    with more overhead, would be slower still); and earlier, after `early_steps`, if they are already
    `early_margin` times slower: a sampled request at temperature 1 on the default model (tau ~1.2, a
    2 ms sampled step) spent ~40 ms of its 256 tokens in 32 losing steps (treeflash bench on the H200:
    0.86x of plain decoding).
    Across requests of one kind (one loop each): after `losses_in_row` requests in a row whose device
    steps lost, the next `skip_requests` decode plainly from their first token; then one probes again
    (a server whose requests sample at temperature 1 would otherwise pay the losing steps on every one)."""

    check_steps: int = 32
    early_steps: int = 8
    early_margin: float = 1.5
    losses_in_row: int = 2
    skip_requests: int = 8

    def __post_init__(self):
        for name in ("check_steps", "early_steps", "losses_in_row"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"GuardTuning.{name} must be an int >= 1, got {getattr(self, name)!r}")
        if not (isinstance(self.skip_requests, int) and self.skip_requests >= 0):
            raise ValueError(f"GuardTuning.skip_requests must be an int >= 0, got {self.skip_requests!r}")
        if not self.early_margin >= 1.0:
            raise ValueError(f"GuardTuning.early_margin must be >= 1.0, got {self.early_margin!r}")


@dataclass
class PendingStep:
    """A step enqueued on the device, its result on the way to the host."""

    host: torch.Tensor  # [head + t] long, pinned on a GPU: the loop's result row
    event: torch.cuda.Event | None  # recorded after the device-to-host copy (None: already there)

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass(frozen=True)
class StepRead:
    """What one device step committed. Vocabulary as in spec/verify.py: `accepted` drafts, then the bonus."""

    accepted: int  # drafts accepted
    depth: int  # the draft tree's depth
    drafted: int  # draft nodes (the budget the step used)
    tokens: list[int]  # the accepted + 1 emitted tokens (the bonus last)


class DeviceLoop(ABC):
    """The device fast path of one drafter (see the module docstring for the protocol)."""

    nodes: int  # verify nodes per step (budget + 1)
    sampled: bool  # draws at temperature > 0 (the Decoder hands a seed to `start`)

    @abstractmethod
    def ready(self, seq_len: int, max_len: int) -> bool: ...

    @abstractmethod
    def start(self, root: int, seq_len: int, params, seed: int) -> None: ...

    @abstractmethod
    def enqueue(self) -> PendingStep: ...

    @abstractmethod
    def room(self, seq_len: int, max_len: int) -> bool: ...

    @abstractmethod
    def read(self, pending: PendingStep) -> StepRead: ...

    @abstractmethod
    def stop(self, observed: int) -> None: ...

    # -- the prefix cache: a loop's build may write the target cache --
    _unclaimed = True  # no request has used this loop yet

    def first_use(self) -> bool:
        """True for the first request that uses this loop, False after: a loop built (captured) for
        that request ran warm-up steps through the target cache, so its rows cannot be resumed."""
        first, self._unclaimed = self._unclaimed, False
        return first

    # -- the guard (a loop whose budget is not tuned keeps these defaults) --
    guarded: bool = False  # whether the Decoder checks these steps against plain decoding
    guard: GuardTuning = GuardTuning()  # how (a guarded loop's own)

    def plain_time(self, seq_len: int) -> float:
        """Seconds of one plain decode step at this context (nothing in flight)."""
        return 0.0

    def skip_request(self) -> bool:
        """At a request's start: whether it decodes plainly from its first token."""
        return False

    def record(self, lost: bool) -> None:
        """A request's verdict from the guard: its device steps lost (or did not)."""


class LossRecord:
    """The guard's memory across requests of one kind (GuardTuning.losses_in_row, skip_requests)."""

    def __init__(self, guard: GuardTuning) -> None:
        self.guard = guard
        self.losses = 0  # requests in a row whose device steps lost to plain decoding
        self.skipped = 0  # requests decoded plainly since then

    def skip_request(self) -> bool:
        if self.losses >= self.guard.losses_in_row and self.skipped < self.guard.skip_requests:
            self.skipped += 1
            return True
        self.skipped = 0
        return False

    def record(self, lost: bool) -> None:
        self.losses = self.losses + 1 if lost else 0
