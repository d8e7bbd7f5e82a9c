"""DDTree holds exactly the top-`budget` prefixes under the factorized score (checked by brute force)."""

import itertools
import math

import pytest
import torch

from treeflash.spec.ddtree import build_tree

VOCAB, DEPTH = 5, 3
ALL_PREFIXES = [p for d in range(1, DEPTH + 1) for p in itertools.product(range(VOCAB), repeat=d)]


def paths(tree) -> list[tuple[int, ...]]:
    """The token prefix that each draft node stands for."""
    ids = tree.token_ids.tolist()
    out: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes):
        out.append(out[tree.parents[i]] + (ids[i],))
    return out[1:]


def score(logp: torch.Tensor, prefix: tuple[int, ...]) -> float:
    return sum(float(logp[d, t]) for d, t in enumerate(prefix))


def random_logp(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(DEPTH, VOCAB, generator=g) * 2.0, dim=-1)


def check_tree_shape(tree, budget: int) -> None:
    assert tree.parents[0] == -1 and tree.budget == budget
    assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
    assert tree.token_ids[0] == 7  # the root
    kids = tree.children()
    ids = tree.token_ids.tolist()
    for k in kids:
        assert len({ids[c] for c in k}) == len(k)  # siblings are distinct tokens


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [1, 2, 3, 7, 16, 40, len(ALL_PREFIXES)])
def test_best_first_is_the_top_budget_prefixes(seed, budget):
    logp = random_logp(seed)
    tree = build_tree(logp, root=7, budget=budget)
    check_tree_shape(tree, budget)
    ranked = sorted(ALL_PREFIXES, key=lambda p: -score(logp, p))
    got = paths(tree)
    assert set(got) == set(ranked[:budget])
    got_scores = [score(logp, p) for p in got]
    assert got_scores == sorted(got_scores, reverse=True)  # nodes enter best first


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [1, 2, 3, 4, 9, 30, len(ALL_PREFIXES)])
def test_chain_seed_is_the_chain_then_the_top_of_the_rest(seed, budget):
    logp = random_logp(seed)
    tree = build_tree(logp, root=7, budget=budget, seed_chain=True)
    check_tree_shape(tree, budget)
    best = logp.argmax(-1).tolist()
    chain = [tuple(best[:d]) for d in range(1, min(DEPTH, budget) + 1)]
    rest = sorted((p for p in ALL_PREFIXES if p not in chain), key=lambda p: -score(logp, p))
    got = paths(tree)
    assert got[: len(chain)] == chain
    assert set(got[len(chain) :]) == set(rest[: budget - len(chain)])


@pytest.mark.parametrize("seed_chain", [False, True])
def test_smaller_budgets_are_prefixes_of_larger_trees(seed_chain):
    """The budget tuner reads off what a smaller tree would have accepted from a larger one."""
    logp = torch.log_softmax(torch.randn(15, 50), dim=-1)
    big = build_tree(logp, root=3, budget=64, seed_chain=seed_chain)
    for b in (1, 2, 5, 14, 15, 16, 22, 40):
        small = build_tree(logp, root=3, budget=b, seed_chain=seed_chain)
        assert small.parents == big.parents[: b + 1]
        assert small.token_ids.tolist() == big.token_ids.tolist()[: b + 1]


def test_impossible_tokens_never_enter():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    for seed_chain in (False, True):
        tree = build_tree(probs.log(), root=0, budget=10, seed_chain=seed_chain)
        assert tree.budget == 4  # {a, b} x {nothing, c}: 2 + 2 prefixes have nonzero probability
        assert all(t in (0, 1) for t in tree.token_ids.tolist())
    assert math.isinf(float(probs.log()[0, 2]))
