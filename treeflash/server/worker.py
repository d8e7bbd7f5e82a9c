"""The one thread that owns the engine: it loads the model, then runs jobs from a bounded queue.

The engine runs one sequence at a time, so HTTP handlers never call it: they submit a `Job` (the
GenerationRequests of one HTTP request: one per choice, run back to back) and read its events
from an asyncio queue that this thread fills. Ordering and failure rules:

- `submit` refuses with 503 while loading or shutting down and with 429 when `max_queue` jobs
  are already waiting (the running job does not count).
- Cancelling a job (client gone, server stopping) sets its `cancelled` Event, which the engine
  checks after every step; a job that has not started yet is simply dropped from the queue.
- An exception inside one job's generation ends that job with an error item; the thread goes
  on to the next job. Out of device memory is one such (a 503); the allocator's cached blocks are
  released first, and the next request's prefill resets the caches it left mid-step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from treeflash.engine.request import GenerationRequest, TokenEvent, Usage
from treeflash.errors import TreeflashError
from treeflash.server.errors import APIError, from_exception, is_out_of_memory

log = logging.getLogger("treeflash.server")

_DONE = object()


@dataclass(eq=False)
class Job:
    requests: list[GenerationRequest]  # one per choice, run in order
    loop: asyncio.AbstractEventLoop
    cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # why it was cancelled: "disconnect" | "shutdown"
    submitted_at: float = field(default_factory=time.perf_counter)
    items: asyncio.Queue = field(default_factory=asyncio.Queue)
    started_at: float | None = None  # when the engine took it (submitted_at to this: the queue wait)
    first_event_at: float | None = None  # when the first tokens reached the handler (for time to first token)
    usages: list[Usage] = field(default_factory=list)  # one per finished choice

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.cancelled.set()

    def put(self, item) -> None:
        """From the worker thread: hand an item to the handler's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """(choice index, event) pairs until the job ends; raises APIError if it failed."""
        while True:
            item = await self.items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise from_exception(item)
            index, event = item
            if self.first_event_at is None:
                self.first_event_at = time.perf_counter()
            if event.usage is not None:
                self.usages.append(event.usage)
            if event.finish_reason == "cancelled" and self.reason == "shutdown":
                raise APIError(503, "the server is shutting down; the generation was stopped")
            yield index, event


class Worker:
    def __init__(self, load: Callable[[], object], max_queue: int, on_load_failed: Callable[[str], None] | None = None):
        self._load = load
        self.max_queue = max_queue
        self.on_load_failed = on_load_failed
        self.engine = None
        self.state = "loading"  # -> "ready" | "failed"; "stopping" once stop() ran
        self.load_error: str | None = None
        self.load_seconds = 0.0
        self._pending: deque[Job] = deque()
        self._running: Job | None = None
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._main, name="treeflash-engine", daemon=True)

    # -- called from the event loop --
    def start(self) -> None:
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return self._running is not None

    def submit(self, job: Job) -> None:
        with self._cv:
            if self.state == "loading":
                raise APIError(503, "the model is still loading; retry when GET /health answers 200")
            if self.state != "ready":
                raise APIError(503, "the server is shutting down" if self.state == "stopping" else f"the model failed to load: {self.load_error}")
            if len(self._pending) >= self.max_queue:
                waiting = f"{self.max_queue} request{'s' if self.max_queue != 1 else ''} waiting"
                raise APIError(429, f"the queue is full ({waiting}, the limit set by --max-queue); retry later")
            self._pending.append(job)
            self._cv.notify()

    def cancel(self, job: Job, reason: str) -> None:
        job.cancel(reason)
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)

    def begin_stop(self) -> None:
        """Refuse new jobs, fail the waiting ones, cancel the running one (it ends at its next step)."""
        with self._cv:
            if self.state in ("ready", "loading"):
                self.state = "stopping"
            for job in self._pending:
                job.cancel("shutdown")
                job.put(APIError(503, "the server is shutting down"))
            self._pending.clear()
            if self._running is not None:
                self._running.cancel("shutdown")
            self._cv.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """begin_stop(), then wait for the thread at most `timeout` seconds (it is a daemon: a load in progress cannot hold the exit)."""
        self.begin_stop()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the worker thread --
    def _main(self) -> None:
        t0 = time.perf_counter()
        try:
            engine = self._load()
        except BaseException as e:  # noqa: BLE001 - any load failure must reach the operator, not kill the thread silently
            with self._cv:
                self.load_error = str(e) if isinstance(e, TreeflashError) else f"{type(e).__name__}: {e}"
                self.state = "failed" if self.state == "loading" else self.state
            log.error("model load failed: %s", self.load_error)
            if self.on_load_failed is not None:
                self.on_load_failed(self.load_error)
            return
        self.load_seconds = time.perf_counter() - t0
        with self._cv:
            self.engine = engine
            if self.state != "loading":
                return  # stopped while loading
            self.state = "ready"
        log.info("model ready in %.1f s", self.load_seconds)
        while True:
            with self._cv:
                while not self._pending and self.state == "ready":
                    self._cv.wait()
                if not self._pending:
                    return
                job = self._running = self._pending.popleft()
                job.started_at = time.perf_counter()
            end = APIError(500, "the engine thread stopped")  # what the handler hears if _run raised past its own handler
            try:
                end = self._run(job)
            finally:  # not running any more before the handler hears the end: a scrape after the reply reads idle
                with self._cv:
                    self._running = None
                job.put(end)

    def _run(self, job: Job):
        """Streams the job's events to its handler; returns the item that ends it: _DONE or the error."""
        try:
            for index, req in enumerate(job.requests):
                if job.cancelled.is_set():
                    if job.reason == "shutdown":  # between two choices: the reply would be silently short
                        return APIError(503, "the server is shutting down; the generation was stopped")
                    break
                stream = self.engine.stream(req, job.cancelled)
                try:  # close() releases engine.lock even if we stop early
                    for event in stream:
                        job.put((index, event))
                finally:
                    stream.close()
        except Exception as e:  # noqa: BLE001 - one request's failure must not stop the server
            if from_exception(e).status >= 500:
                log.exception("generation failed")
            if is_out_of_memory(e):
                _release_cached_memory()  # the failed step's temporaries: give them back before the next request
            return e
        return _DONE


def _release_cached_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
