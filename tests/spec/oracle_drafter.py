"""A test drafter that proposes the target's own greedy continuation, with controlled corruption,
so that zero, partial and full acceptance all happen at every depth, on chains and trees."""

from __future__ import annotations

import copy
import random

import torch

from treeflash.models.step import StepInput
from treeflash.spec.drafter import DraftContext, Drafter
from treeflash.spec.tree import DraftTree


class OracleDrafter(Drafter):
    """Runs a private copy of the target greedily to get the true continuation, then corrupts it.

    width > 1 adds sibling branches (random tokens, and sometimes the true token on a later
    sibling so that the accepted path is not always the first child)."""

    name = "oracle"

    def __init__(self, target, depth: int = 6, width: int = 1, corrupt: float = 0.3, seed: int = 0, vocab: int | None = None):
        self.target, self.depth, self.width, self.corrupt = target, depth, width, corrupt
        self.rng = random.Random(seed)
        self.vocab = vocab or target.config.vocab_size

    @torch.inference_mode()
    def _continuation(self, tokens: list[int], root: int, n: int) -> list[int]:
        cache = self.target.new_cache(len(tokens) + n + 2)
        dev = self.target.device
        ids = torch.tensor(tokens + [root], device=dev)
        out = self.target(StepInput.plain(ids, 0), cache)
        cont = []
        nxt = int(out.logits[-1].argmax())
        for _ in range(n):
            cont.append(nxt)
            out = self.target(StepInput.plain(torch.tensor([nxt], device=dev), cache.seq_len), cache)
            nxt = int(out.logits[-1].argmax())
        return cont

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.depth, max(0, (ctx.max_nodes - 1) // self.width))
        if depth == 0:
            return DraftTree.root_only(ctx.root)
        true = self._continuation(ctx.tokens, ctx.root, depth)
        cut = self.rng.randrange(depth + 1) if self.rng.random() < self.corrupt * 2 else depth
        tokens, parents = [ctx.root], [-1]
        parent = 0
        for d in range(depth):
            tok = true[d] if d < cut else (true[d] + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            main_pos = self.rng.randrange(self.width)
            main_node = None
            for w in range(self.width):
                t = tok if w == main_pos else self.rng.randrange(self.vocab)
                if w != main_pos and t == tok:
                    t = (t + 1) % self.vocab
                tokens.append(t)
                parents.append(parent)
                if w == main_pos:
                    main_node = len(tokens) - 1
            parent = main_node
        return DraftTree(torch.tensor(tokens), parents)


class FactorizedDrafter(Drafter):
    """A block drafter in miniature: a small LM's processed distributions at each depth of its own
    greedy continuation (one per depth, whatever the tokens above: DFlash's factorization), turned
    into a tree by the production builders. deterministic=True keeps DDTree's top-k children but
    still attaches q (a deliberately wrong input for recursive rejection)."""

    name = "factorized"

    def __init__(self, draft_lm, budget: int = 5, depth: int = 2, deterministic: bool = False):
        self.lm, self.budget, self.depth, self.deterministic = draft_lm, budget, depth, deterministic

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        from treeflash.spec.ddtree import build_tree, sample_tree
        from treeflash.spec.sampling import target_probs

        budget = min(self.budget, ctx.max_nodes - 1)
        if budget < 1:
            return DraftTree.root_only(ctx.root)
        seq, rows = list(ctx.tokens) + [ctx.root], []
        for _ in range(self.depth):
            logits = self.lm(StepInput.plain(torch.tensor(seq), 0), self.lm.new_cache(len(seq))).logits[-1:]
            rows.append(target_probs(logits, ctx.params)[0])
            seq.append(int(logits.argmax()))
        q = torch.stack(rows)  # [depth, vocab]
        if self.deterministic:
            tree = build_tree(q.log(), ctx.root, budget)
            depth = torch.tensor(tree.depths()).clamp(max=self.depth - 1)
            tree.child_probs = q[depth]
            return tree
        return sample_tree(q, ctx.root, budget, ctx.generator)
