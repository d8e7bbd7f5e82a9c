"""`mtp` drafter: lossless on a random tiny qwen3_5 target with random MTP weights, and every
proposal equals the MTP chain computed from scratch (so the head reads the right hidden states)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.spec.test_draft_model import random_prompt, run, tiny_lm  # noqa: F401 (fixture)
from tests.spec.test_lossless_greedy import rejected_per_depth
from treeflash.errors import InvalidRequestError
from treeflash.models.mtp import MTPHead
from treeflash.models.step import StepInput
from treeflash.spec.drafter import DraftOptions, build_drafter
from treeflash.spec.mtp import MTPDrafter


def mtp_target(vocab: int = 97, seed: int = 0):
    target = tiny_lm("qwen3_5", seed, scale=0.06, vocab_size=vocab, mtp_num_hidden_layers=1)
    assert target.config.mtp_num_layers == 1
    with torch.random.fork_rng():
        torch.manual_seed(seed + 100)
        head = MTPHead(target.config, 1).eval()
        with torch.no_grad():
            for p in head.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    target.mtp = head
    return target


@pytest.mark.parametrize("vocab,seed", [(97, 0), (6, 1)])  # vocab 6: random MTP weights still get drafts accepted
def test_mtp_is_lossless(vocab, seed):
    target = mtp_target(vocab, seed)
    prompt = random_prompt(12, vocab)
    ref, _ = run(target, prompt, 200)
    out, stats = run(target, prompt, 200, MTPDrafter(target, 3))
    assert out == ref
    if vocab == 6:  # random MTP weights on 6 tokens: accepted [40, 23, 4] and rejected [93, 17, 19] at depths 1..3
        assert stats.proposed_per_depth == [stats.passes] * 3  # every pass drafted 3 tokens, so:
        assert all(a > 0 for a in stats.accepted_per_depth)  # some pass accepted a draft at every depth,
        assert all(r > 0 for r in rejected_per_depth(stats))  # and some pass rejected the draft at every depth


class Recorder(MTPDrafter):
    def __init__(self, *args):
        super().__init__(*args)
        self.seen = []

    def propose(self, ctx):
        tree = super().propose(ctx)
        self.seen.append((list(ctx.tokens), ctx.root, tree.token_ids[1:].tolist()))
        return tree


@torch.inference_mode()
def mtp_chain_from_scratch(target, tokens, root, k):
    """Row t = (x_{t+1}, h_t) for t < len(tokens), h after the target's final norm; then chain."""
    hidden = target(StepInput.plain(torch.tensor(tokens), 0), target.new_cache(len(tokens))).hidden
    n = len(tokens)
    cache = target.mtp.new_cache(n + k)
    nxt = torch.tensor(tokens[1:] + [root])
    h = target.mtp(target.embed(nxt), hidden, torch.arange(n), cache)[-1:]
    drafts = []
    for i in range(k):
        drafts.append(int(target.head(h)[0].argmax()))
        h = target.mtp(target.embed(torch.tensor(drafts[-1:])), h, torch.tensor([n + i]), cache)
    return drafts


def test_proposals_equal_the_mtp_chain_from_scratch():
    target = mtp_target(vocab=6, seed=1)
    drafter = Recorder(target, 3)
    run(target, random_prompt(9, 6), 40, drafter)
    run(target, random_prompt(20, 6, seed=1), 20, drafter)  # a second sequence: reset; the prompt is read in observe
    assert len(drafter.seen) > 8
    for tokens, root, drafts in drafter.seen:
        assert drafts == mtp_chain_from_scratch(target, tokens, root, 3)


def test_registry():
    target = mtp_target()
    loaded = SimpleNamespace(model=target, config=target.config, tokenizer=None, source="qwen36.gguf")
    drafter = build_drafter("mtp", loaded, DraftOptions(num_draft=4))
    assert isinstance(drafter, MTPDrafter) and drafter.capture_layers == (target.config.num_layers - 1,)
    target.mtp = None
    with pytest.raises(InvalidRequestError, match="qwen36.gguf has no MTP head"):
        build_drafter("mtp", loaded, DraftOptions())


@pytest.mark.parametrize("budget", [2, 7, 16])
def test_mtp_tree_is_lossless(budget):
    """--mtp-tree: a DDTree of `budget` nodes from the head's per-depth distributions, verified by
    the same verifier: the output equals plain decoding, and the trees branch (width > 1)."""
    target = mtp_target(6, 1)
    prompt = random_prompt(12, 6)
    ref, _ = run(target, prompt, 150)
    drafter = MTPDrafter(target, 3, tree_budget=budget)
    widths = []
    propose = drafter.propose

    def recording(ctx):
        tree = propose(ctx)
        assert tree.num_nodes - 1 == min(budget, ctx.max_nodes - 1)
        widths.append(tree.num_nodes - 1 - max(tree.depths()))
        return tree

    drafter.propose = recording
    out, stats = run(target, prompt, 150, drafter)
    assert out == ref
    assert stats.accepted_per_depth[0] > 0
    if budget > 3:
        assert max(widths) > 0  # more nodes than depths: some depth holds siblings


def test_registry_mtp_tree():
    target = mtp_target()
    loaded = SimpleNamespace(model=target, config=target.config, tokenizer=None, source="x")
    assert build_drafter("mtp", loaded, DraftOptions(num_draft=4, mtp_tree=True)).tree_budget == 12  # auto: 3 per depth
    assert build_drafter("mtp", loaded, DraftOptions(num_draft=4, mtp_tree=True, budget=9)).tree_budget == 9
    assert build_drafter("mtp", loaded, DraftOptions(num_draft=4)).tree_budget is None
