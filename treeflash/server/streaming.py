"""The two ways a chunk stream reaches a client, both cancelling the job when the client leaves.

- `JobStream`: each chunk as one server-sent event in the route's `SSEFormat`: OpenAI's chat and
  completions send `data: {json}` and end with `data: [DONE]`; Anthropic's and the Responses API
  name each event after the chunk's `type` (`event: message_start`) and send no end marker. An
  error after the 200 has gone out becomes one error event in the route's envelope. Starlette cancels
  the body when the client disconnects; the `finally` then cancels the job, and the engine
  stops at its next step.
- `folded_response`: the non-streaming reply, a fold over the same chunks, raced against the
  client's disconnect (nobody else would notice it before the generation ends).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response, StreamingResponse

from treeflash.server.errors import APIError
from treeflash.server.worker import Job, Worker

CLIENT_CLOSED = 499  # nginx's "client closed request": only our metrics ever see it


def encode_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"


DONE_EVENT = "data: [DONE]\n\n"


def encode_named_event(obj: dict) -> str:
    """`event: <type>` then the data line, as Anthropic's and the Responses API's streams are."""
    return f"event: {obj['type']}\n" + encode_event(obj)


@dataclass(frozen=True)
class SSEFormat:
    encode: Callable[[dict], str]
    error: Callable[[APIError], dict]  # the event an error after the 200 becomes
    done: str | None  # the end marker, if the API has one


OPENAI_SSE = SSEFormat(encode_event, APIError.body, DONE_EVENT)


class JobStream(StreamingResponse):
    """The streaming reply for one job: whatever ends it (the last chunk, a disconnect, a
    cancellation before the body even started), the job is cancelled unless it finished."""

    def __init__(self, chunks: AsyncIterator[dict], job: Job, worker: Worker, on_end: Callable[[], None],
                 sse: SSEFormat = OPENAI_SSE):
        self.job, self.worker, self.on_end, self.sse = job, worker, on_end, sse
        self.finished = False
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(self._events(chunks), media_type="text/event-stream", headers=headers)

    async def _events(self, chunks: AsyncIterator[dict]):
        try:
            async for chunk in chunks:
                yield self.sse.encode(chunk)
        except APIError as e:
            yield self.sse.encode(self.sse.error(e))
        if self.sse.done is not None:
            yield self.sse.done
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
