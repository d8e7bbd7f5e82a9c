"""Typed boundary between callers (CLI, HTTP server, bench) and the engine: no JSON, no HTTP here."""

from __future__ import annotations

from dataclasses import dataclass, field

from treeflash.errors import InvalidRequestError
from treeflash.spec.sampling import SamplingParams


GRAMMAR_KINDS = ("json_schema", "regex", "grammar", "choice")


@dataclass(frozen=True)
class Grammar:
    """A structured-output constraint (engine/grammar.py compiles it; the HTTP side builds it)."""

    kind: str  # json_schema | regex | grammar (Lark or GBNF) | choice
    source: str  # the JSON schema as JSON text, the regex, the grammar text, or the choices as a JSON list of strings
    param: str = "response_format"  # the request field it came from: errors name it

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(f"{self.param}: unknown grammar kind {self.kind!r}; one of {', '.join(GRAMMAR_KINDS)}",
                                      self.param)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings: output is cut before the first match
    stop_token_ids: tuple[int, ...] = ()  # extra tokens that end generation (EOS is always one)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k >= 0: the chosen token's logprob plus the top k
    min_tokens: int = 0  # end tokens masked and stop strings not matched before this many output tokens (vLLM's)
    grammar: Grammar | None = None  # the output must match it (masked at every token, speculation included)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}", "max_tokens")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise InvalidRequestError(f"top_logprobs must be in [0, 20], got {self.logprobs}", "top_logprobs")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty", "stop")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got {self.min_tokens}",
                                      "min_tokens")
        if self.grammar is not None and self.ignore_eos:
            raise InvalidRequestError("ignore_eos cannot be combined with a grammar (a complete grammar ends with the "
                                      "end-of-sequence token)", "ignore_eos")


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
