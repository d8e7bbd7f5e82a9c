"""`mtp` drafter: the target's own multi-token-prediction head (Qwen3.5/3.6, Qwen3-Next), chained.

MTPHead row t reads (embedding of x_{t+1}, the target's hidden state h_t after its final norm)
at position t and predicts x_{t+2} (models/mtp.py). The drafter asks the target for its last
layer's output (`capture_layers`) and applies the target's final norm itself, so `observe`
receives h_t for every committed token. The head's KV cache holds one committed row per position
whose next token is known; it reads a prompt's rows in `observe`, and at `propose` (when the
root is known) the rows still unread, the last of which (root as x_{t+1}) predicts the first
draft token. Each further draft token feeds its embedding and the previous head output back in,
at the next position; afterwards the drafted rows are dropped with `cache.truncate` (the head
has attention layers only).

Tree mode (`tree_budget`, `--mtp-tree`): the head runs the same num_draft-deep chain along its
most likely token at each depth, and its per-depth distributions (each conditioned on that top-1
prefix, the factorized score DDTree assumes) go to spec/ddtree.py's best-first search for a tree of
`tree_budget` nodes. The one verifier keeps it exact: greedy walks the target's argmax, sampling
uses sample-and-match (the tree carries no draft probabilities). Whether trees beat chains for MTP
depends on the trained head's calibration; random test weights say nothing about it.
"""

from __future__ import annotations

from typing import Any

import torch

from treeflash.errors import InvalidRequestError
from treeflash.models.transformer import CausalLM
from treeflash.spec.ddtree import build_tree
from treeflash.spec.draft_model import PREFILL_CHUNK, chain_tree, draft_token
from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.sampling import target_probs
from treeflash.spec.tree import DraftTree

MIN_EAGER_ROWS = 16  # observe reads rows ahead of propose only for a prompt-sized batch
MTP_TREE_NODES_PER_DEPTH = 3  # --mtp-tree with --budget auto (a starting point; no trained head here to tune it on)


class MTPDrafter(Drafter):
    name = "mtp"

    def __init__(self, target: CausalLM, num_draft: int, tree_budget: int | None = None):
        if target.mtp is None:
            raise ValueError("the target has no MTP head")
        if tree_budget is not None and tree_budget < 1:
            raise ValueError(f"tree_budget must be positive, got {tree_budget}")
        self.target, self.head, self.num_draft, self.tree_budget = target, target.mtp, num_draft, tree_budget
        self.capture_layers = (target.config.num_layers - 1,)
        self.cache = self.head.new_cache(1)  # sized at the first propose (the target's cache length)
        self.tokens: list[int] = []  # committed tokens observed
        self.hidden: list[torch.Tensor] = []  # [n, H] h_t for the committed positions the head has not read

    def reset(self) -> None:
        self.cache.reset()
        self.tokens, self.hidden = [], []

    def observe(self, committed_ids: list[int], hidden: torch.Tensor | None) -> None:
        if hidden is None or hidden.shape[0] != len(committed_ids):
            raise RuntimeError("mtp drafter: the decoder did not pass the captured hidden states")
        self.tokens.extend(committed_ids)
        self.hidden.append(self.target.model.norm(hidden))  # the head reads post-norm states
        # a prompt: read every row whose next token is known now (prefill time), when the cache,
        # sized by an earlier sequence, has room; the last row waits for the root
        if len(self.tokens) - self.cache.seq_len > MIN_EAGER_ROWS and len(self.tokens) + self.num_draft < self.cache.max_len:
            with torch.inference_mode():
                self._read(self.tokens[self.cache.seq_len + 1 :])

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        num = len(ctx.tokens)
        if len(self.tokens) != num:
            raise RuntimeError(f"mtp drafter: observed {len(self.tokens)} committed tokens, the decoder has {num}")
        budget = ctx.max_nodes - 1 if self.tree_budget is None else min(self.tree_budget, ctx.max_nodes - 1)
        k = min(self.num_draft, budget)
        dev = self.target.device
        if k <= 0:
            return DraftTree.root_only(ctx.root, dev)
        if num + ctx.max_nodes > self.cache.max_len:  # = the target cache's max_len; fixed per sequence
            assert self.cache.seq_len == 0, "mtp drafter: the target's cache grew within a sequence"
            self.cache = self.head.new_cache(num + ctx.max_nodes)

        h = self._read(self.tokens[self.cache.seq_len + 1 :] + [ctx.root])  # predicts the token after the root
        drafts, qs, logits = [], [], []
        for i in range(k):
            row = self.target.head(h)[0]  # [vocab] fp32
            if self.tree_budget is None:
                tok, q = draft_token(row, ctx.params, ctx.generator, self.target.config.vocab_size)
                if q is not None:
                    qs.append(q)
            else:  # the tree's spine: the most likely token; the tree search reads every depth's distribution
                logits.append(row)
                tok = int(row.argmax())
            drafts.append(tok)
            if i + 1 < k:  # chain: the drafted token and the head's own output, one position on
                ids = torch.tensor([tok], dtype=torch.long, device=dev)
                h = self.head(self.target.embed(ids), h, torch.tensor([num + i], device=dev), self.cache)
        self.cache.truncate(num)
        if self.tree_budget is None:
            return chain_tree(ctx.root, drafts, qs, dev)
        return build_tree(self._tree_logprobs(torch.stack(logits), ctx), ctx.root, budget)

    @staticmethod
    def _tree_logprobs(logits: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """[D, vocab]: each depth's guess of the target token, under the request's sampler (tokens the
        sampler cannot draw get -inf and are never drafted)."""
        if ctx.params.greedy:
            return torch.log_softmax(logits, dim=-1)
        return target_probs(logits, ctx.params).log()

    def _read(self, next_ids: list[int]) -> torch.Tensor:
        """Commit head rows t = seq_len.. reading (x_{t+1} = next_ids, h_t); the last row's output [1, H]."""
        start, n, dev = self.cache.seq_len, len(next_ids), self.target.device
        hidden = torch.cat(self.hidden)
        assert 0 < n <= hidden.shape[0], "mtp drafter: every step commits a new row"
        self.hidden = [hidden[n:]]
        ids = torch.tensor(next_ids, dtype=torch.long, device=dev)
        for s in range(0, n, PREFILL_CHUNK):
            part = slice(s, min(s + PREFILL_CHUNK, n))
            pos = torch.arange(start + part.start, start + part.stop, device=dev)
            h = self.head(self.target.embed(ids[part]), hidden[part], pos, self.cache)
        return h[-1:]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "num_draft": self.num_draft, "mtp_layers": len(self.head.layers), "tree_budget": self.tree_budget}


@register("mtp")
def _build(target, options: DraftOptions) -> Drafter:
    if getattr(target.model, "mtp", None) is None:
        raise InvalidRequestError(
            f"--draft mtp: {target.source} has no MTP head (no mtp.* weights loaded); use a Qwen3.5/3.6 "
            "checkpoint that carries one (Hugging Face mtp.* tensors, or an MTP GGUF with blk.N.nextn.* tensors), or another drafter",
            "draft",
        )
    tree_budget = None
    if options.mtp_tree:  # --budget is the node count; 'auto': MTP_TREE_NODES_PER_DEPTH per drafted depth
        tree_budget = options.budget if isinstance(options.budget, int) else MTP_TREE_NODES_PER_DEPTH * options.num_draft
    return MTPDrafter(target.model, options.num_draft, tree_budget)
