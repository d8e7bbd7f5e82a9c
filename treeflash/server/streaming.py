"""The two ways a chunk stream reaches a client, both cancelling the job when the client leaves.

- `JobStream`: each chunk as `data: {json}\\n\\n`, then `data: [DONE]`. An error after the
  200 has gone out becomes one `data: {"error": ...}` event before `[DONE]`. Starlette cancels
  the body when the client disconnects; the `finally` then cancels the job, and the engine
  stops at its next step.
- `folded_response`: the non-streaming reply, a fold over the same chunks, raced against the
  client's disconnect (nobody else would notice it before the generation ends).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi.responses import JSONResponse, Response, StreamingResponse

from treeflash.server.errors import APIError
from treeflash.server.worker import Job, Worker

CLIENT_CLOSED = 499  # nginx's "client closed request": only our metrics ever see it


def encode_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"


DONE_EVENT = "data: [DONE]\n\n"


class JobStream(StreamingResponse):
    """The streaming reply for one job: whatever ends it (the last chunk, a disconnect, a
    cancellation before the body even started), the job is cancelled unless it finished."""

    def __init__(self, chunks: AsyncIterator[dict], job: Job, worker: Worker, on_end: Callable[[], None]):
        self.job, self.worker, self.on_end = job, worker, on_end
        self.finished = False
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(self._events(chunks), media_type="text/event-stream", headers=headers)

    async def _events(self, chunks: AsyncIterator[dict]):
        try:
            async for chunk in chunks:
                yield encode_event(chunk)
        except APIError as e:
            yield encode_event(e.body())
        yield DONE_EVENT
        self.finished = True

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.finished:
                self.worker.cancel(self.job, "disconnect")
            self.on_end()


async def folded_response(fold: Callable[[AsyncIterator[dict]], Awaitable[dict]], chunks: AsyncIterator[dict], job: Job,
                          worker: Worker, receive, on_end: Callable[[], None]) -> Response:
    folding = asyncio.ensure_future(fold(chunks))
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({folding, watching}, return_when=asyncio.FIRST_COMPLETED)
        if folding.done():
            return JSONResponse(folding.result())  # an APIError from the job propagates to its handler
        worker.cancel(job, "disconnect")
        folding.cancel()
        return Response(status_code=CLIENT_CLOSED)
    finally:
        watching.cancel()
        if not folding.done():
            worker.cancel(job, "disconnect")
            folding.cancel()
        on_end()


async def _disconnected(receive) -> None:
    """Returns when the client disconnects (the body has been read already, so nothing else arrives)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
