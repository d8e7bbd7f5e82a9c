"""The OpenAI-compatible request bodies, as pydantic models, and their validation.

Parsing is strict (no "0.5" for a float, no 1.5 for an int, no NaN) and every failure becomes one
400 that names the field. Unknown fields are ignored, as OpenAI clients send extras; known fields
whose behaviour treeflash does not offer (penalties, logit_bias, best_of, ...) are refused with a
400 that says so, rather than silently ignored.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from treeflash.engine.request import Grammar
from treeflash.server.errors import bad_request
from treeflash.server.structured import only_one, openai_format, vllm_fields
from treeflash.server.tool_choice import ForcedChoice, check_choice

MAX_N = 8  # choices per request (n x prompts); they run one after another
MAX_STOP = 16  # stop strings per request
MAX_TOP_LOGPROBS = 20
SEED_RANGE = (-(2**63), 2**63 - 1 - MAX_N)  # seed + choice index must stay a valid torch seed


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="after")
    def _null_means_default(self):
        # OpenAI accepts null for every optional field: a null flag or count is its default
        for name in ("n", "stream", "ignore_eos", "logprobs", "echo", "add_special_tokens", "add_generation_prompt"):
            info = type(self).model_fields.get(name)
            if info is not None and getattr(self, name) is None and info.default is not None:
                setattr(self, name, info.default)
        return self


StrictModel = _Strict  # the base every wire format's request models share (server/anthropic, server/responses)


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"  # a JSON string per OpenAI; a dict is accepted too


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Strict):
    type: str
    text: str | None = None


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # -1 or 0: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: Any = None  # str | list[str]; checked by stop_strings() for a clear message
    stop_token_ids: list[int] | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    min_tokens: int | None = Field(None, ge=0)  # vLLM's: no end token, no stop string before this many tokens
    # structured outputs (server/structured.py reads them; each is checked there, for a 400 naming it)
    response_format: dict[str, Any] | None = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None

    def grammar(self) -> Grammar | None:
        """The request's structured-output constraint (at most one of the fields), or None."""
        guided = {name: getattr(self, name) for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                                         "guided_decoding_backend", "guided_whitespace_pattern")}
        return only_one([openai_format(self.response_format), vllm_fields(self.structured_outputs, guided)])

    def check_supported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise bad_request(f"{name} is not supported (speculative verification samples the target's own distribution); use 0", name)
        if self.repetition_penalty not in (None, 1, 1.0):
            raise bad_request("repetition_penalty is not supported; use 1.0", "repetition_penalty")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")

    def stop_strings(self) -> tuple[str, ...]:
        stop = self.stop
        if stop is None:
            return ()
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad_request("stop must be a string or a list of strings", "stop")
        if len(stop) > MAX_STOP:
            raise bad_request(f"at most {MAX_STOP} stop strings, got {len(stop)}", "stop")
        if any(not s for s in stop):
            raise bad_request("stop strings must be non-empty", "stop")
        return tuple(stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        structured = self.grammar()
        check_choice(self.forced_tool_choice(), [t.function.name for t in self.tools or ()],
                     structured.param if structured is not None else None, "tool_choice.function.name")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if self.max_tokens is not None and self.max_completion_tokens is not None and self.max_tokens != self.max_completion_tokens:
            raise bad_request("max_tokens and max_completion_tokens differ; send one", "max_completion_tokens")

    def forced_tool_choice(self) -> ForcedChoice | None:
        """tool_choice "required" (any of the tools) or {"type": "function", "function": {"name"}} (that one)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return ForcedChoice(self.tool_choice.function.name)
        return ForcedChoice() if self.tool_choice == "required" else None

    @property
    def max_tool_calls(self) -> int | None:
        return 1 if self.parallel_tool_calls is False else None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: Any  # str | list[str] | list[int] | list[list[int]]; checked by prompts()
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise bad_request("echo is not supported", "echo")
        if self.suffix:
            raise bad_request("suffix (fill-in-the-middle) is not supported", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise bad_request("best_of is not supported (send n instead)", "best_of")

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts, each a string or a list of token ids."""
        p = self.prompt
        shape = "prompt must be a string, a list of strings, a list of token ids, or a list of lists of token ids"
        if isinstance(p, str):
            return [p]
        if not isinstance(p, list) or not p:
            raise bad_request(shape if not isinstance(p, list) else "prompt is empty", "prompt")
        if all(_is_token_id(t) for t in p):
            return [p]
        if all(isinstance(t, str) for t in p):
            return list(p)
        if all(isinstance(t, list) and t and all(_is_token_id(x) for x in t) for t in p):
            return list(p)
        raise bad_request(shape + " (not a mix, and no empty lists)", "prompt")

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = True
    add_generation_prompt: bool | None = True
    tools: list[ToolDef] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def _is_token_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse(model: type[_Strict], body: bytes) -> Any:
    """JSON bytes -> a validated request model, or a 400 naming the first bad field."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = _loc(err["loc"])
        detail = err["msg"]
        if err["type"] == "json_invalid":
            raise bad_request(f"the body is not valid JSON: {err.get('ctx', {}).get('error', detail)}") from None
        if err["type"] in ("model_type", "model_attributes_type") and not loc:
            raise bad_request("the body must be a JSON object") from None
        raise bad_request(f"{loc or 'body'}: {detail}" + _got(err), loc or None) from None
    check = getattr(req, "check_supported", None)
    if check is not None:
        check()
    return req


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or part in ("str", "int", "float", "bool", "dict", "list", "function-after"):
            continue  # a union member's tag, not a field
        else:
            out += ("." if out else "") + str(part)
    return out


def _got(err: dict) -> str:
    value = err.get("input")
    if value is None or isinstance(value, (dict, list)):
        return ""
    text = repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    return f" (got {text[:60]})"

