"""A constraint written as a rule over the output so far: the spec layer's tests need one whose
allowed sets are known without llguidance (and one that forbids a lot, so pruning and masking bite)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from treeflash.spec.constraint import Constraint


class RuleConstraint(Constraint):
    """allowed(history) -> the permitted tokens after `history` (the output so far)."""

    def __init__(self, vocab: int, rule: Callable[[list[int]], set[int]], strict: bool = True):
        self.vocab, self.rule, self.strict = vocab, rule, strict  # strict: a forbidden advance is a test failure
        self.history: list[int] = []
        self.masks_computed = 0  # how many allowed() calls: NodeMasks must be lazy

    def allowed(self) -> torch.Tensor:
        self.masks_computed += 1
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[sorted(self.rule(self.history))] = True
        return mask

    def accepts(self, token: int) -> bool:
        return token in self.rule(self.history)

    def advance(self, token: int) -> None:
        assert not self.strict or self.accepts(token), f"advanced by forbidden token {token} after {self.history}"
        self.history.append(token)

    def rollback(self, n: int) -> None:
        assert 0 <= n <= len(self.history)
        del self.history[len(self.history) - n:]

    def reset(self) -> None:
        self.history = []


def alternating(vocab: int) -> Callable[[list[int]], set[int]]:
    """Even tokens first; then always a token of the other parity than the last one."""

    def rule(history: list[int]) -> set[int]:
        if not history:
            return {t for t in range(vocab) if t % 2 == 0}
        last = history[-1]
        return {t for t in range(vocab) if t % 2 != last % 2}

    return rule
