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

and, for a drafter whose budget is tuned (`guarded`, --budget auto), a policy per request that picks,
step by step, a device step or a plain one (which still feeds the drafter, so drafting can resume):
`begin_request`, `choose`, `observe_plain`, `timed`.
Tokens are those of the synchronous steps (greedy) or the same distribution (sampled): a loop is an
implementation of the same step, checked against the target alone (tests/spec/test_device_loop.py
shows a minimal one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

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
    guarded: bool = False  # whether the Decoder asks `choose` before each step

    def begin_request(self) -> None:
        """A request that may use this loop starts (its policy starts from the earlier requests' prior)."""

    def choose(self, seq_len: int, in_flight: bool) -> bool:
        """Before a step (in_flight: a device step is still to be read): True for a device step, False for a
        plain decode step. Timing passes may run only with nothing in flight."""
        return True

    def observe_plain(self) -> None:
        """The step `choose` turned down ran plainly."""

    def timed(self, step_s: float) -> None:
        """Seconds between two device steps' reads within a run (the pipelined step time)."""
