"""`ngram` drafter: prompt lookup. Match the longest recent suffix (ngram_max down to ngram_min
tokens) against earlier committed tokens and propose what followed its latest occurrence. The
copy may run into the tokens it proposes itself, so inside a repeating cycle shorter than the
draft ("a b a b ...") the proposal continues the cycle for all k tokens instead of stopping at
the end of the sequence."""

from __future__ import annotations

from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.tree import DraftTree


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, num_draft: int = 5, ngram_max: int = 4, ngram_min: int = 1):
        self.num_draft, self.ngram_max, self.ngram_min = num_draft, ngram_max, ngram_min

    def propose(self, ctx: DraftContext) -> DraftTree:
        seq = ctx.tokens + [ctx.root]
        budget = min(self.num_draft, ctx.max_nodes - 1)
        return DraftTree.chain(ctx.root, lookup(seq, self.ngram_max, self.ngram_min, budget))

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


@register("ngram")
def _build(target, options: DraftOptions) -> Drafter:
    return NgramDrafter(options.num_draft, options.ngram_max, options.ngram_min)
