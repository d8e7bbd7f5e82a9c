"""Typed errors. Each becomes a clear CLI message or an HTTP 4xx; `assert` is for internal invariants only."""


class TreeflashError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class ModelLoadError(TreeflashError):
    """A checkpoint that cannot be loaded: unknown architecture, missing/misshapen tensor, corrupt file."""


class InvalidRequestError(TreeflashError):
    """A request with an invalid field (maps to HTTP 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextOverflowError(InvalidRequestError):
    """Prompt plus max_tokens do not fit the model's context."""
