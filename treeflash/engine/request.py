"""Typed boundary between callers (CLI, HTTP server, bench) and the engine: no JSON, no HTTP here."""

from __future__ import annotations

from dataclasses import dataclass, field

from treeflash.errors import InvalidRequestError
from treeflash.spec.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings: output is cut before the first match
    stop_token_ids: tuple[int, ...] = ()  # extra tokens that end generation (EOS is always one)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k >= 0: the chosen token's logprob plus the top k

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError(f"top_logprobs must be in [0, 20], got {self.logprobs}", "top_logprobs")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", "stop")


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token_id, logprob), best first


@dataclass
class TokenEvent:
    """One streaming event: the tokens committed by one engine step (speculation commits several)."""

    token_ids: list[int]  # new tokens (after stop-string cutting the text may cover fewer)
    text: str  # new text
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | None while running
    logprobs: list[TokenLogprob] | None = None
    usage: "Usage | None" = None  # set on the final event
    stop_string: str | None = None  # on the final event: the stop string that ended the output, if one did


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    seconds: float = 0.0
    first_token_s: float = 0.0
    spec: dict | None = None  # SpecStats.as_dict() when a drafter ran
    cached_tokens: int = 0  # prompt tokens resumed from the prefix cache (not prefilled again)
