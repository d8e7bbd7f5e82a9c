"""What the HTTP side may touch of a loaded engine: the template, the limits, and a tokenizer.

The engine's tokenizer belongs to the worker thread (it detokenizes every step). A Rust-backed
tokenizer must not be used from two threads at once ("Already borrowed"), so request handlers
get their own copy, used under a lock of its own.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

from treeflash.engine.request import Grammar
from treeflash.errors import InvalidRequestError
from treeflash.server.chunks import TokenText
from treeflash.server.errors import bad_request
from treeflash.server.tools import tool_call_form


@dataclass(frozen=True)
class TokenLimits:
    """The server's bounds on output length. Without them one request that leaves max_tokens out
    (or sets it to the context) holds the one-sequence engine for the whole remaining context
    while every other client waits."""

    default_max_tokens: int = 4096  # a request without max_tokens gets this (or the room left, if less)
    max_tokens: int | None = None  # a request asking for more gets a 400; None: the context is the only bound

    def __post_init__(self) -> None:
        if self.default_max_tokens < 1:
            raise InvalidRequestError(f"--default-max-tokens must be >= 1, got {self.default_max_tokens}", "default_max_tokens")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"--max-tokens-cap must be >= 1, got {self.max_tokens}", "max_tokens_cap")

    def resolve(self, requested: int | None, room: int, param: str = "max_tokens") -> int:
        """The max_tokens to run with: `room` is what the context leaves after the prompt."""
        if requested is None:
            default = self.default_max_tokens if self.max_tokens is None else min(self.default_max_tokens, self.max_tokens)
            return max(1, min(default, room))
        if self.max_tokens is not None and requested > self.max_tokens:
            raise bad_request(f"{param} is {requested}, over this server's limit of {self.max_tokens} (--max-tokens-cap)", param)
        return requested


class Frontend:
    def __init__(self, engine, tool_call_parser: str = "auto", template_kwargs: dict[str, Any] | None = None,
                 limits: TokenLimits = TokenLimits()):
        self.engine = engine
        self.limits = limits
        try:
            self.tokenizer = copy.deepcopy(engine.tokenizer)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot be copied is shared, under the lock
            self.tokenizer = engine.tokenizer
        self.lock = threading.Lock()
        self.token_text = TokenText(self.tokenizer, self.lock)
        self.chat_template: str | None = engine.loaded.chat_template
        self.max_context: int = engine.max_context
        self.vocab_size: int = engine.model.config.vocab_size
        self.bos_token: str = getattr(self.tokenizer, "bos_token", None) or ""
        self.eos_token: str = getattr(self.tokenizer, "eos_token", None) or ""
        self.tool_form: str = tool_call_form(self.chat_template, tool_call_parser)  # json | xml: how the model writes calls
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})  # server defaults for chat_template_kwargs
        self.special_tokens: tuple[str, ...] = special_token_texts(self.tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """`text` as ordinary text: a special token's text inside it becomes ordinary tokens, not the control token."""
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        self.engine.check_fits(prompt_len, max_tokens)

    def check_grammar(self, grammar: Grammar | None) -> Grammar | None:
        """The grammar, compiled once against the tokenizer (llguidance's validation): a 400 naming its
        field when it cannot be. Slow the first time (the tokenizer bridge): call it off the event loop."""
        if grammar is not None:
            try:
                self.engine.grammars.check(grammar)
            except InvalidRequestError as e:
                raise bad_request(str(e), e.param) from None
        return grammar


def special_token_texts(tokenizer) -> tuple[str, ...]:
    """The text of every special (control) token the tokenizer knows: named ones and added ones marked special."""
    names = set(getattr(tokenizer, "all_special_tokens", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    names.update(t.content for t in added.values() if getattr(t, "special", False))
    return tuple(sorted(n for n in names if n))
