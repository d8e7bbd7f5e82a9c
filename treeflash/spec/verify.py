"""The one verifier: walk the draft tree with the target's tokens; lossless by construction.

- greedy: the target's token at a node is its argmax; follow the child holding it.
- sample and match (trees, and chains without draft probabilities): draw the target's token at
  each visited node from the request's processed distribution, follow the child holding it. Each
  committed token is a fresh target sample, so the output distribution is the target's.
- rejection sampling (chains with draft probabilities q; Leviathan et al. 2023): accept draft x
  with probability min(1, p(x)/q(x)); on rejection draw the bonus from normalize(max(p - q, 0)).
In every case the walk ends with one bonus token drawn from the target, so a pass commits
accepted + 1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.spec.sampling import SamplingParams, sample, target_probs
from treeflash.spec.tree import DraftTree


@dataclass
class VerifyResult:
    path: list[int]  # node ids to commit: the root, then each accepted draft node
    tokens: list[int]  # tokens to emit: accepted draft tokens, then the bonus token

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify(
    tree: DraftTree,
    logits: torch.Tensor,  # [N, vocab]: the target's logits at every node
    params: SamplingParams,
    generator: torch.Generator | None,
    argmax: torch.Tensor | None = None,  # [N]: logits.argmax(-1) when the step computed it (a CUDA graph)
) -> VerifyResult:
    if params.greedy:
        return _walk(tree, (logits.argmax(-1) if argmax is None else argmax).tolist())
    probs = target_probs(logits, params)  # [N, vocab] fp32
    if tree.child_probs is not None and tree.is_chain() and tree.num_nodes > 1:
        return _rejection_chain(tree, probs, generator)
    return _sample_and_match(tree, probs, generator)


def _walk(tree: DraftTree, target_tokens: list[int]) -> VerifyResult:
    kids = tree.children()
    ids = tree.token_ids.tolist()
    path, tokens, node = [0], [], 0
    while True:
        want = target_tokens[node]
        nxt = next((c for c in kids[node] if ids[c] == want), None)
        tokens.append(want)
        if nxt is None:
            return VerifyResult(path, tokens)  # `want` is the bonus
        path.append(nxt)
        node = nxt


def _sample_and_match(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None) -> VerifyResult:
    kids = tree.children()
    ids = tree.token_ids.tolist()
    path, tokens, node = [0], [], 0
    while True:
        want = int(sample(probs[node : node + 1], generator)[0])  # a fresh target sample at this node
        nxt = next((c for c in kids[node] if ids[c] == want), None)
        tokens.append(want)
        if nxt is None:
            return VerifyResult(path, tokens)
        path.append(nxt)
        node = nxt


def _rejection_chain(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None) -> VerifyResult:
    q_all = tree.child_probs
    assert q_all is not None
    ids = tree.token_ids.tolist()
    n = tree.num_nodes
    u = torch.rand(n - 1, generator=generator, device=probs.device).tolist()
    path, tokens = [0], []
    for d in range(n - 1):  # node d proposes its child d + 1
        p, q, x = probs[d], q_all[d].to(probs.device).float(), ids[d + 1]
        px, qx = float(p[x]), float(q[x])
        if qx > 0 and u[d] * qx < px:  # accept with probability min(1, p(x)/q(x))
            path.append(d + 1)
            tokens.append(x)
            continue
        residual = (p - q).clamp_min(0.0)
        total = float(residual.sum())
        dist = residual / total if total > 0 else p  # p == q: the residual is empty, any target draw is exact
        tokens.append(int(sample(dist[None], generator)[0]))
        return VerifyResult(path, tokens)
    tokens.append(int(sample(probs[n - 1 : n], generator)[0]))  # all accepted: bonus from the last node
    return VerifyResult(path, tokens)
