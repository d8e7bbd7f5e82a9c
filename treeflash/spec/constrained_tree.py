"""A draft tree under a request's constraint (spec/constraint.py): prune it, then mask its nodes.

Before verification `prune` removes the draft nodes the constraint forbids, with their subtrees: the
masked target never picks a forbidden token, so they could never be accepted, and they would cost
verify budget. Nodes below an end token go too: the output ends there. Under a rule on the
drafter's q (chain rejection, recursive rejection: verify.uses_draft_probs) a forbidden node stays,
as a leaf: it is rejected (p(x) = 0) and the bonus comes from the residual max(p - q, 0), as those
rules need; dropping it would swap that residual for p exactly when the draft was forbidden, a
choice that depends on the draft's value and biases the output. Only its subtree goes.

During verification `NodeMasks.at(node)` is the constraint's allowed set after the path from the
root to `node`: the constraint walks there (back to the common ancestor, then down) when a node is
first asked for, so only the nodes the acceptance rule visits cost a mask. `close()` walks it back
to the root, where the decoder then advances it by the committed tokens.

The constraint starts each step positioned after the root (the root was emitted, so advanced).
"""

from __future__ import annotations

import torch

from treeflash.spec.constraint import Constraint
from treeflash.spec.tree import DraftTree


def prune(tree: DraftTree, constraint: Constraint, end_ids: set[int], keep_forbidden: bool = False) -> DraftTree:
    """The tree without the nodes `constraint` forbids (see the module docstring); node order kept."""
    kids = tree.children()
    ids = tree.token_ids.tolist()
    keep = [0]
    stack: list[tuple[int, bool]] = [(0, False)]  # (node, leaving): depth-first, the constraint follows the path
    while stack:
        node, leaving = stack.pop()
        if leaving:
            constraint.rollback(1)
            continue
        if node != 0:
            constraint.advance(ids[node])
            stack.append((node, True))
        for c in reversed(kids[node]):
            if not constraint.accepts(ids[c]):
                if keep_forbidden:
                    keep.append(c)
                continue
            keep.append(c)
            if ids[c] not in end_ids:  # below an end token nothing is emitted
                stack.append((c, False))
    if len(keep) == tree.num_nodes:
        return tree
    keep.sort()  # parents precede children in the old order, so they do in the kept one
    new_id = {old: new for new, old in enumerate(keep)}
    parents = [-1] + [new_id[tree.parents[old]] for old in keep[1:]]
    index = torch.tensor(keep, device=tree.token_ids.device)
    probs = tree.child_probs[index.to(tree.child_probs.device)] if tree.child_probs is not None else None
    return DraftTree(tree.token_ids[index], parents, probs)


class NodeMasks:
    """The constraint's allowed set at the nodes of a pruned tree, computed lazily along paths."""

    def __init__(self, tree: DraftTree, constraint: Constraint, end_ids: set[int]):
        self.parents = tree.parents
        self.ids = tree.token_ids.tolist()
        self.constraint, self.end_ids = constraint, end_ids
        self.path = [0]  # the nodes the constraint has consumed, from the root
        self.seen: dict[int, torch.Tensor | None] = {}

    def at(self, node: int) -> torch.Tensor | None:
        """[vocab] bool: the tokens permitted after the path root -> node (None: all)."""
        if node in self.seen:
            return self.seen[node]
        path = [node]
        while path[-1] != 0:
            path.append(self.parents[path[-1]])
        path.reverse()  # [0, ..., node]
        if any(self.ids[n] in self.end_ids for n in path[1:]):
            self.seen[node] = None  # the output ended on this path: what follows is cut, any distribution is exact
            return None
        common = 1
        while common < min(len(path), len(self.path)) and path[common] == self.path[common]:
            common += 1
        self.constraint.rollback(len(self.path) - common)
        for n in path[common:]:
            assert self.constraint.accepts(self.ids[n]), "a forbidden node was visited: prune first"
            self.constraint.advance(self.ids[n])
        self.path = path
        self.seen[node] = self.constraint.allowed()
        return self.seen[node]

    def close(self) -> None:
        """Walk the constraint back to the root."""
        self.constraint.rollback(len(self.path) - 1)
        self.path = [0]
