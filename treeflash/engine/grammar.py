"""Grammars as constraints (spec/constraint.py), through llguidance (PyPI `llguidance`, MIT).

A request's Grammar (engine/request.py) is compiled against the engine's tokenizer: JSON schemas
(OpenAI's json_schema and json_object, vLLM's guided_json), regular expressions, Lark or GBNF
grammars and choices. `GrammarCompiler.check` runs when the request is built, so a schema llguidance
cannot compile (an unknown keyword, a bad regex) is a 400 naming the request's field; `constraint`
makes the per-request matcher the decoder masks with.

The matcher follows the output token by token (advance / rollback: llguidance's own, exact). It is
never advanced by a token it forbids (that would put it in its error state for good): the decoder
and the tree pruning ask `accepts` first, and no end token is ever consumed (the output ends there).
A grammar that is complete allows only the end-of-sequence tokens (the engine's EOS ids).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import torch

from treeflash.engine.request import Grammar
from treeflash.engine.token_bytes import TokenizerBridge
from treeflash.errors import InvalidRequestError
from treeflash.spec.constraint import Constraint


def grammar_text(grammar: Grammar) -> str:
    """The llguidance grammar for a request's Grammar (raises InvalidRequestError naming its field)."""
    import llguidance

    try:
        if grammar.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(grammar.source)
        if grammar.kind == "regex":
            return llguidance.grammar_from("regex", grammar.source)
        if grammar.kind == "grammar":  # Lark, or GBNF (llama.cpp / vLLM's EBNF), converted to Lark
            return llguidance.grammar_from("grammar", grammar.source)
        if grammar.kind == "choice":
            return llguidance.grammar_from("choice", grammar.source)
    except ValueError as e:
        raise InvalidRequestError(f"{grammar.param}: {e}", grammar.param) from None
    raise InvalidRequestError(f"{grammar.param}: unknown grammar kind {grammar.kind!r}", grammar.param)


class GrammarCompiler:
    """The tokenizer bridge (built on first use: about half a second for a 50k vocabulary) and matchers."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        self._source = (tokenizer, vocab_size, sorted(eos_ids))
        self._lock = threading.Lock()
        self._tok = None
        self.vocab_size = vocab_size

    def tokenizer(self):
        with self._lock:
            if self._tok is None:
                import llguidance

                tokenizer, vocab, eos = self._source
                bridge = TokenizerBridge(tokenizer, vocab, eos)
                self._tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(bridge), n_vocab=vocab, eos_token=eos)
            return self._tok

    def check(self, grammar: Grammar) -> None:
        """A 400 (InvalidRequestError naming grammar.param) for a grammar llguidance cannot compile."""
        import llguidance

        error = llguidance.LLMatcher.validate_grammar(grammar_text(grammar), self.tokenizer())
        if error:
            raise InvalidRequestError(f"{grammar.param}: not supported: {_first_line(error)}", grammar.param)

    def constraint(self, grammar: Grammar) -> "GrammarConstraint":
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer(), grammar_text(grammar), log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{grammar.param}: not supported: {_first_line(matcher.get_error())}", grammar.param)
        return GrammarConstraint(matcher, self.vocab_size)


class GrammarConstraint(Constraint):
    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size

    def allowed(self) -> torch.Tensor:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)  # bit i of word w = token 32 w + i
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        self._check()
        return torch.from_numpy(mask)  # [vocab] bool

    def accepts(self, token: int) -> bool:
        return self.matcher.validate_tokens([token]) == 1

    def advance(self, token: int) -> None:
        if not self.matcher.consume_tokens([token]):
            self._check()

    def rollback(self, n: int) -> None:
        if n and not self.matcher.rollback(n):
            self._check()

    def reset(self) -> None:
        self.matcher.reset()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"grammar matcher error: {self.matcher.get_error()}")


def json_object_schema() -> str:
    """OpenAI's {"type": "json_object"}: any JSON object."""
    return json.dumps({"type": "object"})


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else "rejected"
