"""`replay` drafter: an ORACLE for benchmarks, never a real drafter.

It proposes the target's own recorded continuation: every sequence the engine committed in an
earlier request (prompt + output, seen through `observe`) is kept, and a later request whose
committed tokens and root follow a recorded sequence gets the next `num_draft` recorded tokens as
a chain. At temperature 0 the target accepts them all, so tau is num_draft + 1 exactly and the
engine's speculative ceiling (draft cost ~0, verify at real shapes) is measured on random weights:
run a prompt once to record it, then again to replay it. `corrupt` replaces each drafted token
with another with that probability (seeded), for ceilings below full acceptance.

Its figures are labelled as an oracle wherever they appear (describe() says so, generate and bench
print it): a tau or a speedup from this drafter says what the engine could do with a perfect
drafter, nothing about any real one.
"""

from __future__ import annotations

import random

from treeflash.errors import InvalidRequestError
from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.tree import DraftTree

ORACLE_NOTE = "replay is an oracle drafter (the target's own recorded output): its tau and speedup are a ceiling, not a drafter's"


class ReplayDrafter(Drafter):
    name = "replay"
    oracle = True

    def __init__(self, num_draft: int, vocab_size: int, corrupt: float = 0.0, seed: int = 0, max_records: int = 64):
        if not 0.0 <= corrupt <= 1.0:
            raise InvalidRequestError(f"--replay-corrupt must be in [0, 1], got {corrupt}", "replay_corrupt")
        self.num_draft, self.vocab_size, self.corrupt, self.max_records = num_draft, vocab_size, corrupt, max_records
        self.rng = random.Random(seed)
        self.records: list[list[int]] = []  # earlier requests' committed sequences, newest last
        self._seq: list[int] = []  # this request's committed tokens (what observe saw)
        self._record: list[int] | None = None  # the recorded sequence this request follows
        self._searched = False

    def add_record(self, tokens: list[int]) -> None:
        """Keep a committed sequence (prompt + output) to replay; a longer one replaces its prefixes,
        and a prefix of a kept one adds nothing."""
        if any(r[: len(tokens)] == tokens for r in self.records):
            return
        self.records = [r for r in self.records if tokens[: len(r)] != r][-(self.max_records - 1):] + [list(tokens)]

    def reset(self) -> None:
        if self._seq:  # the sequence that just ended becomes a record
            self.add_record(self._seq)
        self._seq, self._record, self._searched = [], None, False

    def observe(self, committed_ids: list[int], hidden) -> None:
        start = len(self._seq)
        self._seq.extend(committed_ids)
        r = self._record
        if r is not None and r[start : start + len(committed_ids)] != list(committed_ids):
            self._record = None  # the target left the record (sampling, or a near-tie): draft nothing more

    def propose(self, ctx: DraftContext) -> DraftTree:
        n = len(ctx.tokens)
        if not self._searched:  # once per request: the newest record that continues these tokens
            self._searched = True
            self._record = next((r for r in reversed(self.records) if len(r) > n and r[:n] == ctx.tokens), None)
        r = self._record
        k = min(self.num_draft, ctx.max_nodes - 1)
        if r is None or len(r) <= n or r[n] != ctx.root or k <= 0:
            return DraftTree.root_only(ctx.root)
        draft = r[n + 1 : n + 1 + k]
        if self.corrupt > 0:
            draft = [(t + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
                     if self.rng.random() < self.corrupt else t for t in draft]
        return DraftTree.chain(ctx.root, draft)

    def describe(self) -> dict:
        return {"name": self.name, "oracle": True, "note": ORACLE_NOTE, "num_draft": self.num_draft,
                "corrupt": self.corrupt}


@register("replay")
def _build(target, options: DraftOptions) -> Drafter:
    return ReplayDrafter(options.num_draft, target.config.vocab_size, options.replay_corrupt)
