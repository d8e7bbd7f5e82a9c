"""DDTree (Ringel & Romano, arXiv 2604.12989): the best draft tree from per-depth distributions.

A block drafter (DFlash) gives one distribution per depth, the same whatever the tokens above it,
so a prefix (t_1, ..., t_d) scores sum_k logp[k-1, t_k] (the factorized score). The tree holds the
`budget` best-scoring prefixes. Since a child scores no more than its parent and, with each depth's
candidates sorted, a sibling no more than the sibling before it, best-first search finds them:
pop the best prefix, push its next sibling and its first child, stop at `budget` nodes.

With `seed_chain` (Lucebox's variant) the top-1 chain goes in first, then best-first fills the
rest of the budget: its frontier starts as the second-best sibling of every chain node.

Nodes enter the tree in the order they are popped, so parents precede children, and the tree of
budget b is the first b nodes of the tree of any larger budget (with or without the seed): the
budget tuner relies on this to read off what a smaller tree would have accepted.

`sample_tree` is the tree for sampled requests under tree_sampling="rejection" (verify.py): the
same shape (best-first over the drafter's processed distributions, so it depends on q only, never
on a random draw), with each node's children drawn from q without replacement (Gumbel-top-m, in
draw order: the j-th child of a node is its j-th draw). Recursive rejection needs exactly that;
the deterministic top-k children of `build_tree` would bias it (verify.py says why).
"""

from __future__ import annotations

import numpy as np
import torch

from treeflash.kernels.spec.ddtree import best_first  # the host search: the reference beside its GPU kernel
from treeflash.spec.tree import DraftTree

__all__ = ["best_first", "build_tree", "sample_tree", "tree_from_top"]


def build_tree(
    logprobs: torch.Tensor,  # [D, vocab] fp32: row d = log-probabilities of the token at depth d + 1
    root: int,
    budget: int,  # draft nodes, the root excluded
    seed_chain: bool = False,
) -> DraftTree:
    k = max(1, min(budget, logprobs.shape[1]))  # a top-`budget` prefix never uses a rank >= budget at any depth
    top_lp, top_ids = logprobs.float().topk(k, dim=-1)
    return tree_from_top(top_lp.tolist(), top_ids.tolist(), root, budget, seed_chain, logprobs.device)


def tree_from_top(
    top_lp: list[list[float]],  # [D][k]: each depth's best k log-probabilities, descending
    top_ids: list[list[int]],  # [D][k]: their token ids
    root: int,
    budget: int,
    seed_chain: bool = False,
    device: torch.device | str = "cpu",
) -> DraftTree:
    parents, ranks = best_first(top_lp, budget, seed_chain)
    depth = [0] * len(parents)
    tokens = [root]
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
        tokens.append(top_ids[depth[i] - 1][ranks[i]])
    return DraftTree(torch.from_numpy(np.array(tokens, dtype=np.int64)).to(device), parents)  # from_numpy: ~3x cheaper than torch.tensor(list)


def sample_tree(
    probs: torch.Tensor,  # [D, vocab] fp32: row d = the drafter's processed distribution q at depth d + 1
    root: int,
    budget: int,
    generator: torch.Generator | None,
    seed_chain: bool = False,
) -> DraftTree:
    """A DDTree-shaped tree whose children are drawn from q without replacement; child_probs row i
    is q at node i's depth + 1 (what its children were drawn from). Batched over the nodes that
    have children: one Gumbel draw [P, vocab] and one top-m, no loop over the vocabulary."""
    k = max(1, min(budget, probs.shape[1]))
    logq = probs.float().log()  # [D, vocab]; filtered-out tokens are -inf: never drawn
    top_lp = logq.topk(k, dim=-1).values
    parents, ranks = best_first(top_lp.tolist(), budget, seed_chain)  # the shape: a function of q only
    n = len(parents)
    depth = [0] * n
    width: dict[int, int] = {}  # parent -> its number of children
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
        width[parents[i]] = max(width.get(parents[i], 0), ranks[i] + 1)
    device = probs.device
    depth_t = torch.tensor(depth, dtype=torch.long, device=device)
    tokens = torch.empty(n, dtype=torch.long, device=device)
    tokens[0] = root
    if width:
        owners = sorted(width)  # [P] parent nodes
        rows = logq[depth_t[torch.tensor(owners, device=device)]]  # [P, vocab]: q of each parent's children
        u = torch.rand(rows.shape, generator=generator, device=device).clamp_(1e-20, 1.0)
        keys = rows - (-u.log()).log()  # log q + Gumbel: its descending order is a draw without replacement
        drawn = keys.topk(max(width.values()), dim=-1).indices  # [P, m]
        slot = {p: j for j, p in enumerate(owners)}
        child = torch.tensor([slot[parents[i]] for i in range(1, n)], device=device)
        rank = torch.tensor(ranks[1:], device=device)
        tokens[1:] = drawn[child, rank]
    child_probs = probs.float()[depth_t.clamp(max=probs.shape[0] - 1)]  # [N, vocab]
    leaf_rows = depth_t >= probs.shape[0]  # the deepest nodes draw no children
    if bool(leaf_rows.any()):
        child_probs[leaf_rows] = 0.0
    return DraftTree(tokens, parents, child_probs)
