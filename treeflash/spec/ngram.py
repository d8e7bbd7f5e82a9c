"""`ngram` drafter: prompt lookup. Match the longest recent suffix (ngram_max down to ngram_min
tokens) against earlier committed tokens and propose what followed its latest occurrence. The
copy may run into the tokens it proposes itself, so inside a repeating cycle shorter than the
draft ("a b a b ...") the proposal continues the cycle for all k tokens instead of stopping at
the end of the sequence.

`lookup` is the definition (a scan, O(context) per call); `NgramIndex` answers the same query in
O(new tokens) per step by keeping, for every n, a map from each n-gram to the end of its latest
occurrence, updated as tokens are committed. The drafter uses the index: at 128K tokens of context
the scan costs tens of milliseconds a step, more than a target pass."""

from __future__ import annotations

from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.tree import DraftTree


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, num_draft: int = 5, ngram_max: int = 4, ngram_min: int = 1):
        self.num_draft, self.ngram_max, self.ngram_min = num_draft, ngram_max, ngram_min
        self.index = NgramIndex(ngram_max, ngram_min)

    def reset(self) -> None:
        self.index = NgramIndex(self.ngram_max, self.ngram_min)

    def propose(self, ctx: DraftContext) -> DraftTree:
        budget = min(self.num_draft, ctx.max_nodes - 1)
        return DraftTree.chain(ctx.root, self.index.lookup(ctx.tokens, ctx.root, budget))

    def describe(self) -> dict:
        return {"name": self.name, "num_draft": self.num_draft, "ngram_max": self.ngram_max}


def lookup(seq: list[int], n_max: int, n_min: int, k: int) -> list[int]:
    """The up-to-k tokens that followed the latest earlier occurrence of seq's longest suffix."""
    if k <= 0:
        return []
    for n in range(min(n_max, len(seq) - 1), n_min - 1, -1):
        suffix = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):  # latest occurrence first, excluding the suffix itself
            if seq[start : start + n] == suffix:
                out: list[int] = []
                for j in range(start + n, start + n + k):  # j < len(seq) + len(out): always defined
                    out.append(seq[j] if j < len(seq) else out[j - len(seq)])
                return out
    return []


class NgramIndex:
    """`lookup(tokens + [root], n_max, n_min, k)` without the scan or the copy of the context.

    For seq = tokens + [root], an earlier occurrence of a suffix ends (exclusive) at e <= len(tokens),
    so it lies inside `tokens`: the index holds, for each n, n-gram -> its latest end e over the
    committed tokens. `tokens` may only grow between calls (a new sequence gets a new index, see
    NgramDrafter.reset); a sequence that is not an extension of the indexed one is re-indexed."""

    def __init__(self, n_max: int, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_max, self.n_min = n_max, n_min
        self._ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self._indexed = 0  # every n-gram ending at e <= _indexed is in _ends
        self._last: int | None = None  # tokens[_indexed - 1]: a cheap check that tokens only grew

    def update(self, tokens: list[int]) -> None:
        """Index the n-grams of tokens committed since the last call (O(new tokens x n sizes))."""
        if len(tokens) < self._indexed or (self._indexed and tokens[self._indexed - 1] != self._last):
            self.__init__(self.n_max, self.n_min)  # not an extension: start over
        for e in range(self._indexed + 1, len(tokens) + 1):
            for n, ends in self._ends.items():
                if e >= n:
                    ends[tuple(tokens[e - n : e])] = e
        self._indexed = len(tokens)
        self._last = tokens[-1] if tokens else None

    def lookup(self, tokens: list[int], root: int, k: int) -> list[int]:
        """The up-to-k tokens after the latest earlier occurrence of (tokens + [root])'s longest suffix."""
        self.update(tokens)
        if k <= 0:
            return []
        length = len(tokens)  # seq = tokens + [root] has length + 1 tokens
        for n in range(min(self.n_max, length), self.n_min - 1, -1):
            e = self._ends[n].get((*tokens[length - n + 1 :], root) if n > 1 else (root,))
            if e is None:
                continue
            out: list[int] = []
            for j in range(e, e + k):  # as in lookup: seq[j], or the copy running into its own output
                out.append(tokens[j] if j < length else root if j == length else out[j - length - 1])
            return out
        return []


@register("ngram")
def _build(target, options: DraftOptions) -> Drafter:
    return NgramDrafter(options.num_draft, options.ngram_max, options.ngram_min)
