"""verify(): the greedy walk, sample-and-match, and the rejection chain's bookkeeping, on hand-made
trees and logits (no model)."""

from __future__ import annotations

import pytest
import torch

from tests.spec.test_sampled import chi_square, threshold
from treeflash.spec.sampling import SamplingParams
from treeflash.spec.tree import DraftTree
from treeflash.spec.verify import verify

V = 10
GREEDY = SamplingParams()
T1 = SamplingParams(temperature=1.0)


def point_logits(tokens: list[int]) -> torch.Tensor:
    """[N, V] logits whose row i puts (numerically) all mass on tokens[i]."""
    logits = torch.full((len(tokens), V), -50.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 50.0
    return logits


def log_probs(rows: list[list[float]]) -> torch.Tensor:
    """Logits that give exactly these distributions at temperature 1 (zeros stay zero)."""
    return torch.tensor(rows, dtype=torch.float32).log()


def dist(**mass: float) -> list[float]:
    """dist(t3=0.5, t7=0.5) -> a distribution over V tokens."""
    row = [0.0] * V
    for k, v in mass.items():
        row[int(k[1:])] = v
    return row


# -- greedy --
def test_greedy_walk_follows_the_matching_sibling():
    #        root(9)
    #     /    |     \
    #   1:4   2:5    3:6
    #        /   \
    #      4:7   5:8
    #             |
    #            6:2
    tree = DraftTree(torch.tensor([9, 4, 5, 6, 7, 8, 2]), [-1, 0, 0, 0, 2, 2, 5])
    argmax = [5, 0, 8, 0, 0, 3, 0]  # root -> 5 (node 2) -> 8 (node 5) -> 3 (no child holds it)
    r = verify(tree, point_logits(argmax), GREEDY, None)
    assert r.path == [0, 2, 5] and r.tokens == [5, 8, 3] and r.num_accepted == 2


def test_greedy_root_rejection_and_full_acceptance():
    chain = DraftTree.chain(9, [1, 2, 3])
    r = verify(chain, point_logits([4, 0, 0, 0]), GREEDY, None)
    assert r.path == [0] and r.tokens == [4]  # nothing accepted: the bonus alone
    r = verify(chain, point_logits([1, 2, 3, 7]), GREEDY, None)
    assert r.path == [0, 1, 2, 3] and r.tokens == [1, 2, 3, 7]  # all accepted + the last node's bonus


def test_greedy_ignores_draft_probabilities():
    q = torch.zeros(3, V)
    q[0, 1] = q[1, 5] = 1.0  # the draft was sure of 1 then 5; the target says 1 then 2
    chain = DraftTree.chain(9, [1, 5], child_probs=q)
    r = verify(chain, point_logits([1, 2, 0]), GREEDY, None)
    assert r.path == [0, 1] and r.tokens == [1, 2]


# -- sampled --
def test_sample_and_match_follows_the_sampled_child():
    tree = DraftTree(torch.tensor([9, 4, 5, 6, 7]), [-1, 0, 0, 0, 2])
    g = torch.Generator().manual_seed(0)
    r = verify(tree, point_logits([6, 0, 0, 7, 0]), T1, g)  # point masses: sampling is deterministic
    assert r.path == [0, 3] and r.tokens == [6, 7]
    r = verify(tree, point_logits([5, 0, 7, 0, 1]), T1, g)
    assert r.path == [0, 2, 4] and r.tokens == [5, 7, 1]


def test_rejection_chain_bookkeeping():
    g = torch.Generator().manual_seed(0)
    p_rows = [dist(t1=0.5, t2=0.5), dist(t3=1.0), dist(t4=0.25, t5=0.75), dist(t6=1.0)]
    # q == p: every draft is accepted (u * q(x) < p(x) always); the bonus comes from the last node
    chain = DraftTree.chain(0, [1, 3, 5], child_probs=torch.tensor(p_rows))
    r = verify(chain, log_probs(p_rows), T1, g)
    assert r.path == [0, 1, 2, 3] and r.tokens == [1, 3, 5, 6]

    # p(x) = 0 at depth 2: rejected there; the token comes from max(p - q, 0) = the other mass
    p_rows = [dist(t1=1.0), dist(t3=1.0), dist(t4=1.0), dist(t6=1.0)]
    q_rows = [dist(t1=1.0), dist(t7=0.5, t3=0.5), dist(t0=1.0), [0.0] * V]
    chain = DraftTree.chain(0, [1, 7, 0], child_probs=torch.tensor(q_rows))
    for _ in range(20):
        r = verify(chain, log_probs(p_rows), T1, g)
        assert r.path == [0, 1] and r.tokens == [1, 3]  # 1 accepted; 7 always rejected, the residual is only 3

    # rejected at the root: path [0] and one token from the residual, never the rejected draft
    q_rows = [dist(t2=1.0), [0.0] * V]
    chain = DraftTree.chain(0, [2], child_probs=torch.tensor(q_rows))
    seen = {verify(chain, log_probs([dist(t1=0.5, t2=0.5), dist(t0=1.0)]), T1, g).tokens[0] for _ in range(50)}
    assert seen == {1, 2}  # 2 accepted (p/q = 0.5) or 1 from the residual
    for _ in range(20):
        r = verify(chain, log_probs([dist(t1=1.0), dist(t0=1.0)]), T1, g)
        assert r.path == [0] and r.tokens == [1]


def first_token_counts(tree: DraftTree, logits: torch.Tensor, params: SamplingParams, n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int], int] = {}
    for _ in range(n):
        key = (verify(tree, logits, params, g).tokens[0],)
        counts[key] = counts.get(key, 0) + 1
    return counts


N = 4000


@pytest.mark.parametrize("with_q", [True, False])  # rejection sampling, and sample-and-match on a tree
def test_first_token_is_distributed_as_the_target(with_q):
    """P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum min(p, q)) residual(x) = p(x), and likewise for match."""
    p = torch.tensor([0.30, 0.05, 0.20, 0.0, 0.15, 0.10, 0.05, 0.10, 0.0, 0.05])
    q = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.05, 0.05, 0.10, 0.0, 0.10, 0.0])
    logits = torch.stack((p, p)).log()
    if with_q:
        draws = torch.multinomial(q, N, replacement=True, generator=torch.Generator().manual_seed(1)).tolist()
        g = torch.Generator().manual_seed(2)
        counts: dict[tuple[int], int] = {}
        for x in draws:  # a fresh draft token from q for every trial
            chain = DraftTree.chain(9, [x], child_probs=torch.stack((q, torch.zeros(V))))
            key = (verify(chain, logits, T1, g).tokens[0],)
            counts[key] = counts.get(key, 0) + 1
    else:
        tree = DraftTree(torch.tensor([9, 1, 0, 3]), [-1, 0, 0, 0])
        counts = first_token_counts(tree, logits[[0, 1, 1, 1]], T1, N, seed=3)
    stat, df = chi_square(counts, {(i,): float(v) for i, v in enumerate(p.tolist())}, N)
    assert stat < threshold(df)


# -- recursive rejection (trees with children drawn from q without replacement) --
def test_recursive_rejection_bookkeeping():
    g = torch.Generator().manual_seed(0)
    #      root(0)
    #     /      \
    #   1:1      2:2
    #    |
    #   3:3
    p_rows = [dist(t1=0.5, t2=0.5), dist(t3=1.0), dist(t5=1.0), dist(t6=1.0)]
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), [-1, 0, 0, 1], child_probs=torch.tensor(p_rows))
    rejection = SamplingParams(temperature=1.0, tree_sampling="rejection")
    for _ in range(20):  # q == p: the first child is always accepted, then its child, then the last node's bonus
        r = verify(tree, log_probs(p_rows), rejection, g)
        assert r.path == [0, 1, 3] and r.tokens == [1, 3, 6]
    # the first child is impossible under p: rejected; q without it leaves only the second child, which p holds
    p_rows = [dist(t2=1.0), dist(t3=1.0), dist(t5=1.0), dist(t6=1.0)]
    q_rows = [dist(t1=0.5, t2=0.5), dist(t3=1.0), [0.0] * V, [0.0] * V]
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), [-1, 0, 0, 1], child_probs=torch.tensor(q_rows))
    for _ in range(20):
        r = verify(tree, log_probs(p_rows), rejection, g)
        assert r.path == [0, 2] and r.tokens == [2, 5]
    # every child rejected: the bonus comes from the residual, never a rejected child
    p_rows = [dist(t4=0.5, t1=0.5), dist(t3=1.0), dist(t5=1.0), dist(t6=1.0)]
    q_rows = [dist(t1=0.6, t2=0.4), dist(t3=1.0), [0.0] * V, [0.0] * V]
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), [-1, 0, 0, 1], child_probs=torch.tensor(q_rows))
    seen = {tuple(verify(tree, log_probs(p_rows), rejection, g).tokens[:1]) for _ in range(200)}
    assert seen == {(1,), (4,)}  # 1 accepted (p/q = 5/6), or 4 from the residual; 2 (p = 0) never


def test_match_rule_ignores_child_probs_on_trees():
    """tree_sampling="match": sample-and-match even when the tree carries q (it is exact for any tree)."""
    q_rows = [dist(t1=1.0), dist(t3=1.0), [0.0] * V, [0.0] * V]
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), [-1, 0, 0, 1], child_probs=torch.tensor(q_rows))
    p_rows = [dist(t2=1.0), dist(t3=1.0), dist(t5=1.0), dist(t6=1.0)]
    r = verify(tree, log_probs(p_rows), SamplingParams(temperature=1.0, tree_sampling="match"), torch.Generator().manual_seed(0))
    assert r.path == [0, 2] and r.tokens == [2, 5]


def test_recursive_rejection_first_token_is_distributed_as_the_target():
    """Three children drawn from q without replacement (ddtree.sample_tree) at every trial: the token
    leaving the root is distributed as p, whatever q, filtered tokens included."""
    from treeflash.spec.ddtree import sample_tree

    p = torch.tensor([0.30, 0.05, 0.20, 0.0, 0.15, 0.10, 0.05, 0.10, 0.0, 0.05])
    q = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.05, 0.05, 0.10, 0.0, 0.10, 0.0])
    logits = torch.stack((p,) * 4).log()
    g, gd = torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)
    counts: dict[tuple[int], int] = {}
    rejection = SamplingParams(temperature=1.0, tree_sampling="rejection")
    for _ in range(N):
        tree = sample_tree(q[None], 9, 3, gd)  # one depth: the root and three children
        assert tree.parents == [-1, 0, 0, 0] and len(set(tree.token_ids[1:].tolist())) == 3
        key = (verify(tree, logits, rejection, g).tokens[0],)
        counts[key] = counts.get(key, 0) + 1
    stat, df = chi_square(counts, {(i,): float(v) for i, v in enumerate(p.tolist())}, N)
    assert stat < threshold(df)
