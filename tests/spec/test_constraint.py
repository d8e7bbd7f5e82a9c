"""Constraints under speculation (spec/constraint.py, spec/constrained_tree.py, verify's masks).

Pruning drops exactly the forbidden drafts (and what lies below them or below an end token), keeps
forbidden children as leaves for recursive rejection, and leaves the constraint where it found it;
NodeMasks masks only the nodes it is asked for; and greedy constrained speculation is token-identical
to plain constrained decoding, with drafters whose drafts the constraint often forbids.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from tests.spec.rule_constraint import RuleConstraint, alternating
from treeflash.spec.constrained_tree import NodeMasks, prune
from treeflash.spec.constraint import AllOf, MinTokens, masked
from treeflash.spec.decoder import Decoder
from treeflash.spec.ngram import NgramDrafter
from treeflash.spec.sampling import SamplingParams
from treeflash.spec.tree import DraftTree
from treeflash.spec.verify import verify

VOCAB = 10


def tree_of(tokens, parents):
    return DraftTree(torch.tensor(tokens), parents)


def test_min_tokens_masks_end_tokens_until_enough_are_out():
    c = MinTokens(2, {3, 7}, VOCAB)
    assert not c.allowed()[3] and not c.allowed()[7] and c.allowed()[4] and not c.accepts(7)
    c.advance(1)
    assert not c.accepts(3)
    c.advance(1)
    assert c.allowed() is None and c.accepts(3)
    c.rollback(1)
    assert not c.accepts(3)
    c.reset()
    assert c.produced == 0


def test_all_of_intersects_and_a_later_part_yields_when_nothing_would_be_left():
    only_eos = RuleConstraint(VOCAB, lambda h: {9})  # a complete grammar: only the end token
    both = AllOf([only_eos, MinTokens(5, {9}, VOCAB)])
    assert both.allowed().nonzero().flatten().tolist() == [9] and both.accepts(9)  # min_tokens yields
    some = AllOf([RuleConstraint(VOCAB, lambda h: {2, 9}), MinTokens(5, {9}, VOCAB)])
    assert some.allowed().nonzero().flatten().tolist() == [2] and not some.accepts(9) and some.accepts(2)


def test_masked_sets_minus_infinity_outside_the_allowed_set():
    logits = torch.arange(VOCAB, dtype=torch.float32)[None]
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[1, 4]] = True
    out = masked(logits, allowed)
    assert int(out.argmax()) == 4 and torch.isinf(out[0, 9]) and masked(logits, None) is logits


def test_prune_drops_forbidden_subtrees_and_restores_the_constraint():
    c = RuleConstraint(VOCAB, alternating(VOCAB))
    c.advance(2)  # the root (even) was emitted: children must be odd
    #        0:root(2)
    #   1:(3)     2:(4 forbidden)   3:(5)
    #  4:(6) 5:(7 forbidden)  6:(1, under 2)   7:(8, under 3: end token)  8:(9, under 7)
    tree = tree_of([2, 3, 4, 5, 6, 7, 1, 8, 9], [-1, 0, 0, 0, 1, 1, 2, 3, 7])
    out = prune(tree, c, end_ids={8})
    assert out.token_ids.tolist() == [2, 3, 5, 6, 8] and out.parents == [-1, 0, 0, 1, 2]
    assert c.history == [2]
    kept = prune(tree, c, end_ids={8}, keep_forbidden=True)  # forbidden children stay as leaves
    assert kept.token_ids.tolist() == [2, 3, 4, 5, 6, 7, 8] and kept.parents == [-1, 0, 0, 0, 1, 1, 3]
    assert c.history == [2]
    allowed = tree_of([2, 3, 4], [-1, 0, 1])
    assert prune(allowed, c, set()) is allowed


def test_node_masks_are_lazy_and_follow_any_path():
    c = RuleConstraint(VOCAB, alternating(VOCAB))
    c.advance(2)
    tree = tree_of([2, 3, 5, 4, 6], [-1, 0, 0, 1, 2])  # 3 -> 4 and 5 -> 6
    masks = NodeMasks(tree, c, end_ids=set())
    assert masks.at(3).nonzero().flatten().tolist() == [1, 3, 5, 7, 9]  # after 2, 3, 4: odd
    assert masks.at(2).nonzero().flatten().tolist() == [0, 2, 4, 6, 8]  # after 2, 5: even (a sibling branch)
    assert masks.at(2) is masks.at(2) and c.masks_computed == 2
    masks.close()
    assert c.history == [2]
    ended = NodeMasks(tree_of([2, 3, 4], [-1, 0, 1]), c, end_ids={3})
    assert ended.at(2) is None  # below an end token anything goes: the output ended there


def test_verify_with_masks_applies_the_constraint_at_every_visited_node():
    c = RuleConstraint(VOCAB, alternating(VOCAB))
    c.advance(2)
    tree = tree_of([2, 3, 8], [-1, 0, 1])
    logits = torch.zeros(3, VOCAB)
    logits[:, 8] = 5.0  # the unconstrained argmax everywhere: even, so forbidden at node 0 and node 2
    logits[0, 3], logits[2, 1] = 4.0, 3.0
    result = verify(tree, logits, SamplingParams(), None, masks=NodeMasks(tree, c, set()))
    assert result.tokens == [3, 8, 1] and result.path == [0, 1, 2]  # node 1 (after an odd) may take 8; node 2 may not
    assert verify(tree, logits, SamplingParams(), None).tokens == [8]  # unconstrained: the root's argmax, no draft accepted


def run(model, prompt, n, drafter=None, make=None, params=SamplingParams()):
    constraint = make() if make is not None else None
    dec = Decoder(model, model.new_cache(len(prompt) + n + 80), params, drafter, constraint=constraint)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
@pytest.mark.parametrize("drafter", ["oracle-chain", "oracle-tree", "ngram"])
def test_greedy_constrained_speculation_is_token_identical(arch, drafter):
    _, model = make_pair(arch)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    make = lambda: RuleConstraint(vocab, alternating(vocab))  # noqa: E731
    ref, _ = run(model, prompt, 60, make=make)
    assert all(t % 2 != s % 2 for s, t in zip(ref, ref[1:])) and ref[0] % 2 == 0
    assert ref != run(model, prompt, 60)[0]  # the constraint changed the output
    drafters = {"oracle-chain": lambda: OracleDrafter(model, depth=5, width=1, corrupt=0.4),
                "oracle-tree": lambda: OracleDrafter(model, depth=4, width=3, corrupt=0.4),
                "ngram": lambda: NgramDrafter(num_draft=4, ngram_max=2)}
    out, stats = run(model, prompt, 60, drafters[drafter](), make)
    assert out == ref
    if drafter != "ngram":  # the oracle drafts the unconstrained continuation: some drafts survive the pruning
        assert stats.passes < 59


def test_min_tokens_under_speculation_equals_plain():
    _, model = make_pair("llama")
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    free, _ = run(model, prompt, 40)
    ends = set(free[:20])  # tokens the model writes early: as end tokens they would end it at once
    make = lambda: MinTokens(20, ends, vocab)  # noqa: E731
    ref, _ = run(model, prompt, 40, make=make)
    assert not ends & set(ref[:20]) and ref != free
    out, _ = run(model, prompt, 40, OracleDrafter(model, depth=4, width=2, corrupt=0.3), make)
    assert out == ref
