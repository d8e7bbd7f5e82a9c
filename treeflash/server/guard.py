"""What stands between the network and the handlers: the header size limit, the Host check (DNS
rebinding, server/hosts.py), the API key, the JSON content type, the body size limit and the time
the body may take, and the count of requests by route and status (every answer is counted,
refusals included)."""

from __future__ import annotations

import asyncio
import hmac

from starlette.requests import ClientDisconnect, Request

from treeflash.server.errors import APIError
from treeflash.server.hosts import HostPolicy
from treeflash.server.metrics import Metrics, route_label

OPEN_PATHS = ("/health", "/v1/health", "/metrics", "/v1/metrics")  # probes and scrapers need no key
MAX_HEADER_BYTES = 64 * 1024  # request headers (names + values) over this get 431
MAX_DRAIN_FACTOR = 16  # past the limit, read (and drop) up to this many limits so the client sees the 413


class Gate:
    """Pure ASGI middleware: the key check runs before any routing or body parsing."""

    def __init__(self, app, api_key: str | None, metrics: Metrics, hosts: HostPolicy = HostPolicy()):
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.metrics = metrics
        self.hosts = hosts

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
            headers = dict(scope["headers"])
            host = headers.get(b"host", b"").decode("latin-1")
            if not self.hosts.allows(host):
                refusal = APIError(403, f"the Host header {host[:100]!r} is not allowed: this server (bound to {self.hosts.bound}) "
                                        "answers only localhost, 127.0.0.1 and [::1]; add names with --allowed-hosts", code="host_not_allowed")
                await refusal.response(scope["path"])(scope, receive, counted_send)
                return
            if self.key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                refusal = APIError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                                   code="invalid_api_key")
                await refusal.response(scope["path"])(scope, receive, counted_send)
                return
            media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if scope["method"] == "POST" and media and media != b"application/json" and not media.endswith(b"+json"):
                # a web page can POST text/plain or a form to any address without asking (no CORS preflight);
                # it cannot send application/json that way
                refusal = APIError(415, f"the body must be JSON sent as 'Content-Type: application/json', got {media[:80].decode('latin-1')!r}",
                                   code="unsupported_media_type")
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


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The whole body within `timeout_s` seconds (408 otherwise: a client sending a byte a second
    must not hold a connection and a handler forever), or 413 before anything is parsed."""
    if timeout_s is None:
        return await _read_body(request, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, limit)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s (--body-timeout)") from None


async def _read_body(request: Request, limit: int) -> bytes:
    """By Content-Length when sent, by counting when chunked. An oversized body is still read to its
    end (up to a cap) so the client gets the answer."""
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
