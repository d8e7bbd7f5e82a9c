"""What stands between the network and the handlers: the header size limit, the API key, the body
size limit, and the count of requests by route and status (every answer is counted, refusals included)."""

from __future__ import annotations

import hmac

from starlette.requests import ClientDisconnect, Request

from treeflash.server.errors import APIError
from treeflash.server.metrics import Metrics, route_label

OPEN_PATHS = ("/health", "/v1/health", "/metrics", "/v1/metrics")  # probes and scrapers need no key
MAX_HEADER_BYTES = 64 * 1024  # request headers (names + values) over this get 431
MAX_DRAIN_FACTOR = 16  # past the limit, read (and drop) up to this many limits so the client sees the 413


class Gate:
    """Pure ASGI middleware: the key check runs before any routing or body parsing."""

    def __init__(self, app, api_key: str | None, metrics: Metrics):
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            head = sum(len(name) + len(value) for name, value in scope["headers"])
            if head > MAX_HEADER_BYTES:
                refusal = APIError(431, f"the request headers are {head} bytes; the limit is {MAX_HEADER_BYTES} bytes",
                                   code="request_header_fields_too_large")
                await refusal.response(scope["path"])(scope, receive, counted_send)
                return
            if self.key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                refusal = APIError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                                   code="invalid_api_key")
                await refusal.response(scope["path"])(scope, receive, counted_send)
                return
            await self.app(scope, receive, counted_send)
        finally:
            self.metrics.requests.labels(route_label(scope["path"]), str(status[0])).inc()

    def _authorized(self, scope) -> bool:
        """`Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic clients); either one suffices."""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self.key):
                return True
        return False


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 before anything is parsed: by Content-Length when sent, by counting when
    chunked. An oversized body is still read to its end (up to a cap) so the client gets the answer."""
    stream = request.stream()
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, f"invalid Content-Length header: {declared[:40]!r}") from None
        if size > limit:
            await _drain(stream, limit * MAX_DRAIN_FACTOR)
            raise APIError(413, f"the request body is {size} bytes; the limit is {limit} bytes")
    parts, size = [], 0
    try:
        async for part in stream:
            size += len(part)
            if size > limit:
                await _drain(stream, limit * MAX_DRAIN_FACTOR - size)
                raise APIError(413, f"the request body is over the limit of {limit} bytes")
            parts.append(part)
    except ClientDisconnect:
        raise APIError(400, "the client disconnected while sending the body") from None
    return b"".join(parts)


async def _drain(stream, budget: int) -> None:
    try:
        async for part in stream:
            budget -= len(part)
            if budget <= 0:
                return
    except Exception:  # noqa: BLE001 - the client may give up first; the 413 stands either way
        return
