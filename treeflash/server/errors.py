"""HTTP errors: the OpenAI envelope {"error": {"message", "type", "param", "code"}}, and on the
Anthropic routes (/v1/messages...) Anthropic's {"type": "error", "error": {"type", "message"}}.

Every failure a client can see goes through `APIError`, so the status, the type and the
envelope are decided in one place; `response(path)` picks the envelope by the route, so a refusal
made before any handler ran (the Gate's 401, a 404) still speaks the client's dialect.
Engine-side typed errors map onto it with `from_exception`.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from treeflash.errors import InvalidRequestError, TreeflashError

# OpenAI's error types by status; clients (the openai package) pick the exception class by status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}

# Anthropic's error types by status (docs.anthropic.com "Errors"); its SDK also picks classes by status.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}

ANTHROPIC_PREFIXES = ("/v1/messages", "/messages")


def is_anthropic_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PREFIXES)


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        code = self.code if self.code is not None else HTTPStatus(self.status).phrase.lower().replace(" ", "_")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": code}}

    def anthropic_body(self) -> dict:
        kind = _ANTHROPIC_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def body_for(self, path: str) -> dict:
        return self.anthropic_body() if is_anthropic_path(path) else self.body()

    def response(self, path: str = "") -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body_for(path), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def is_out_of_memory(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError)  # torch.cuda.OutOfMemoryError is the same class


def from_exception(e: BaseException) -> APIError:
    """A typed error from the engine or the loader -> 400; out of device memory -> 503 (the planner left too
    little room: the request ends, the server goes on); anything else -> 500 (this request only)."""
    if isinstance(e, APIError):
        return e
    if is_out_of_memory(e):
        first = str(e).splitlines()[0] if str(e) else ""
        return APIError(503, f"out of device memory during generation; the request was stopped and the server goes on serving. "
                             f"Retry, or send a shorter prompt or max_tokens ({first})", code="out_of_memory")
    if isinstance(e, InvalidRequestError):
        return APIError(400, str(e), e.param)
    if isinstance(e, TreeflashError):
        return APIError(400, str(e))
    return APIError(500, f"generation failed: {type(e).__name__}: {e}")
