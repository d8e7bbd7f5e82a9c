"""What the HTTP side may touch of a loaded engine: the template, the limits, and a tokenizer.

The engine's tokenizer belongs to the worker thread (it detokenizes every step). A Rust-backed
tokenizer must not be used from two threads at once ("Already borrowed"), so request handlers
get their own copy, used under a lock of its own.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from treeflash.server.chunks import TokenText
from treeflash.server.tools import tool_call_form


class Frontend:
    def __init__(self, engine, tool_call_parser: str = "auto", template_kwargs: dict[str, Any] | None = None):
        self.engine = engine
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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        self.engine.check_fits(prompt_len, max_tokens)
