"""DraftTree: what every drafter returns. A chain is a tree of width one.

Vocabulary (defined once, used everywhere):
- root: node 0, the token the target must process next (the previous step's bonus token, or the
  first token sampled after prefill). It is not a draft: it is always committed.
- node: a token in the tree; node i > 0 is a draft token whose parent is parents[i] < i.
- depth: distance from the root (the root has depth 0).
- budget: the number of draft nodes (the tree has budget + 1 nodes with the root).
- accepted: draft nodes on the path the target agrees with; bonus: the target's own token after
  the last accepted node; tau: mean tokens committed per target pass (accepted + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftTree:
    token_ids: torch.Tensor  # [N] long, node 0 = root
    parents: list[int]  # [N], parents[0] = -1, parents[i] < i
    # Optional draft distributions for chain rejection sampling: row i = the distribution q the
    # drafter sampled node i's child from (already temperature/top-k/top-p processed). [N, vocab] fp32
    child_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.parents) != self.token_ids.shape[0] or self.parents[0] != -1:
            raise ValueError("DraftTree: parents must start with -1 and match token_ids")

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def budget(self) -> int:
        return self.num_nodes - 1

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents[1:], start=1):
            kids[p].append(i)
        return kids

    def depths(self) -> list[int]:
        d = [0] * self.num_nodes
        for i in range(1, self.num_nodes):
            d[i] = d[self.parents[i]] + 1
        return d

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @staticmethod
    def root_only(root: int, device: torch.device | str = "cpu") -> "DraftTree":
        return DraftTree(torch.tensor([root], dtype=torch.long, device=device), [-1])

    @staticmethod
    def chain(root: int, drafts: list[int], device: torch.device | str = "cpu", child_probs: torch.Tensor | None = None) -> "DraftTree":
        ids = torch.from_numpy(np.array([root, *drafts], dtype=np.int64)).to(device)  # ~3x cheaper than torch.tensor(list)
        return DraftTree(ids, list(range(-1, len(drafts))), child_probs)
