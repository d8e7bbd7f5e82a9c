"""Per-request constraints on the next token: what a request allows after the output so far.

A constraint is a cursor over the output: `advance(token)` moves it one token on, `rollback(n)`
moves it back, and `allowed()` is the set of tokens it permits next ([vocab] bool, or None for
all). The decoder keeps it at the committed output; verification moves it down a draft-tree path
and back (spec/constrained_tree.py). The target's logits at a node are masked (-inf outside the
allowed set) before the acceptance rule, so every committed token is a sample of the constrained
target's distribution: temperature, top-k, top-p and min-p apply to the masked logits, as plain
constrained decoding does.

A complete grammar allows only the end-of-sequence tokens, so the output ends the way an
unconstrained one does: with an end token the target picks (the only one left), plain or speculative.

Two kinds: a grammar (engine/grammar.py: JSON schema, regex, Lark, choice, through llguidance) and
`MinTokens` (end tokens masked until min_tokens tokens are out). `AllOf` combines them in priority
order: a later part that would leave nothing allowed yields (a grammar that is complete allows only
the end token, which min_tokens would mask).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Constraint(ABC):
    @abstractmethod
    def allowed(self) -> torch.Tensor | None:
        """[vocab] bool: the tokens permitted next (None: every token)."""

    @abstractmethod
    def accepts(self, token: int) -> bool:
        """Whether `token` is permitted next (cheaper than allowed()[token])."""

    @abstractmethod
    def advance(self, token: int) -> None:
        """Consume one permitted token."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last n advances."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the empty output (a new sequence starts)."""


class MinTokens(Constraint):
    """The end tokens (EOS, stop_token_ids) are not permitted before `min_tokens` tokens are out
    (vLLM's min_tokens): the token chosen at output position k (1-based) may end only if k > min_tokens."""

    def __init__(self, min_tokens: int, end_ids: set[int] | frozenset[int], vocab: int):
        self.min_tokens, self.produced = min_tokens, 0
        self.end_ids = sorted(t for t in end_ids if 0 <= t < vocab)
        self._mask = torch.ones(vocab, dtype=torch.bool)  # [vocab]
        self._mask[self.end_ids] = False

    def allowed(self) -> torch.Tensor | None:
        return self._mask if self.produced < self.min_tokens else None

    def accepts(self, token: int) -> bool:
        return self.produced >= self.min_tokens or token not in self.end_ids

    def advance(self, token: int) -> None:
        self.produced += 1

    def rollback(self, n: int) -> None:
        self.produced -= n

    def reset(self) -> None:
        self.produced = 0


class AllOf(Constraint):
    """Every part's constraint at once; parts in priority order (see the module docstring)."""

    def __init__(self, parts: list[Constraint]):
        self.parts = parts

    def allowed(self) -> torch.Tensor | None:
        out = None
        for part in self.parts:
            mask = part.allowed()
            if mask is None:
                continue
            both = mask if out is None else out & mask
            if out is not None and not bool(both.any()):
                continue  # this part yields to the ones before it
            out = both
        return out

    def accepts(self, token: int) -> bool:
        if all(p.accepts(token) for p in self.parts):
            return True
        mask = self.allowed()  # a part that refuses it may be yielding
        return mask is None or bool(mask[token])

    def advance(self, token: int) -> None:
        for p in self.parts:
            p.advance(token)

    def rollback(self, n: int) -> None:
        for p in self.parts:
            p.rollback(n)

    def reset(self) -> None:
        for p in self.parts:
            p.reset()


def masked(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """logits [..., vocab] with -inf outside `allowed` ([vocab] bool, None: unchanged)."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))
