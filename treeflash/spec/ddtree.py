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
"""

from __future__ import annotations

import numpy as np
import torch

from treeflash.kernels.ddtree import best_first  # the host search: the reference beside its GPU kernel
from treeflash.spec.tree import DraftTree

__all__ = ["best_first", "build_tree", "tree_from_top"]


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
