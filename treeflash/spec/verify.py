"""The one verifier: walk the draft tree with the target's tokens; lossless by construction.

- greedy: the target's token at a node is its argmax; follow the child holding it.
- sample and match (trees, and chains without draft probabilities): draw the target's token at
  each visited node from the request's processed distribution, follow the child holding it. Each
  committed token is a fresh target sample, so the output distribution is the target's.
- rejection sampling (chains with draft probabilities q; Leviathan et al. 2023): accept draft x
  with probability min(1, p(x)/q(x)); on rejection draw the bonus from normalize(max(p - q, 0)).
- recursive rejection (trees with draft probabilities, SamplingParams.tree_sampling="rejection", opt-in for now;
  SpecInfer's multi-candidate rule, drawn without replacement as in Jeon et al. 2024): at a node
  whose children x_1..x_m were drawn from q without replacement, try them in draw order: accept
  x_i with probability min(1, p(x_i)/q(x_i)); on rejection p <- normalize(max(p - q, 0)) and
  q <- q without x_i, renormalized; when all are rejected the bonus is drawn from the last p.
In every case the walk ends with one bonus token drawn from the target, so a pass commits
accepted + 1 tokens.

Why recursive rejection is exact: one stage is Leviathan's lemma (x ~ q, accepted with
min(1, p/q), else a draw from normalize(max(p - q, 0)) gives a token ~ p). Here the "else" is the
next stage, which must produce a token ~ p' = normalize(max(p - q, 0)): by induction it does, given
that its candidate x_{i+1} is drawn from q' = q without x_i, whatever x_i was (true of a draw without
replacement; and p'(x_i) = 0 whenever x_i can be rejected, so q' loses nothing p' needs). The last
stage's "else" is a draw from p' itself. So the token leaving a node is ~ p, conditioned on the path
so far; the children of the next node are drawn independently of this node's decisions, so the
argument repeats along the path and the committed sequence has the target's distribution.

Why it needs sampled children (ddtree.sample_tree), and sample-and-match does not: the lemma needs
x_i ~ q. DDTree's deterministic top-k children are not a draw: with q = p, rejection over them
would commit argmax q every time (tests/spec/test_sampled.py shows such a verifier failing). Nor could any exact rule beat sample-and-match
on a deterministic tree: the committed tokens must be distributed as the target's, and a token
outside the tree's children is never accepted, so every exact rule accepts p(children) at a node,
which is what sample-and-match accepts. Sampling the children couples them with the target's draw:
one child accepts with probability sum_x min(p(x), q(x)) = 1 - TV(p, q) instead of p(argmax q).

The device path (spec/device_step.py, kernels/spec/accept.py) keeps sample-and-match over its own
deterministic tree until its kernel implements this rule; `_rejection_tree` is the reference a kernel
mirrors: the uniforms for every node drawn at once, vector updates over the vocabulary, a loop only
over the path and each visited node's children.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from treeflash.spec.constrained_tree import NodeMasks
from treeflash.spec.constraint import masked
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
    masks: NodeMasks | None = None,  # a constrained request's allowed tokens per node (spec/constrained_tree.py)
) -> VerifyResult:
    """With `masks`, every rule runs on the constrained target: each visited node's logits are masked
    (-inf outside the allowed set) before argmax or sampling, so the argument above holds for the
    constrained distribution. Only visited nodes are masked (NodeMasks is lazy); the graph's argmax
    is of the unmasked logits, so it is not used then."""
    device = logits.device
    if masks is not None:
        def row(node: int) -> torch.Tensor:  # [1, vocab]: the node's logits, constrained
            return masked(logits[node : node + 1], masks.at(node))

        if params.greedy:
            return _walk(tree, lambda node: int(row(node).argmax(-1)))
        probs_at = lambda node: target_probs(row(node), params)[0]  # noqa: E731
    else:
        if params.greedy:
            return _walk(tree, (logits.argmax(-1) if argmax is None else argmax).tolist().__getitem__)
        probs = target_probs(logits, params)  # [N, vocab] fp32
        probs_at = probs.__getitem__
    if tree.child_probs is not None and tree.num_nodes > 1:
        if tree.is_chain():
            return _rejection_chain(tree, probs_at, generator, device)
        if params.tree_sampling == "rejection":
            return _rejection_tree(tree, probs_at, generator, device)
    return _sample_and_match(tree, probs_at, generator)  # exact for any tree, sampled children included


def uses_draft_probs(tree: DraftTree, params: SamplingParams) -> bool:
    """Whether verify runs a rule on the drafter's q (chain rejection, recursive rejection). A constraint
    must then keep a forbidden draft, as a leaf (it is rejected: p(x) = 0, and the bonus comes from the
    residual): dropping it would make the rule's use depend on the draft's value, which biases the
    output (tests/spec/test_constrained_sampling.py fails so). Only its subtree may go."""
    return (not params.greedy and tree.child_probs is not None and tree.num_nodes > 1
            and (tree.is_chain() or params.tree_sampling == "rejection"))


ProbsAt = Callable[[int], torch.Tensor]  # node -> [vocab] fp32: the target's processed distribution there


def _walk(tree: DraftTree, target_token: Callable[[int], int]) -> VerifyResult:
    kids = tree.children()
    ids = tree.token_ids.tolist()
    path, tokens, node = [0], [], 0
    while True:
        want = target_token(node)
        nxt = next((c for c in kids[node] if ids[c] == want), None)
        tokens.append(want)
        if nxt is None:
            return VerifyResult(path, tokens)  # `want` is the bonus
        path.append(nxt)
        node = nxt


def _sample_and_match(tree: DraftTree, probs_at: ProbsAt, generator: torch.Generator | None) -> VerifyResult:
    kids = tree.children()
    ids = tree.token_ids.tolist()
    path, tokens, node = [0], [], 0
    while True:
        want = int(sample(probs_at(node)[None], generator)[0])  # a fresh target sample at this node
        nxt = next((c for c in kids[node] if ids[c] == want), None)
        tokens.append(want)
        if nxt is None:
            return VerifyResult(path, tokens)
        path.append(nxt)
        node = nxt


def _rejection_chain(tree: DraftTree, probs_at: ProbsAt, generator: torch.Generator | None, device: torch.device) -> VerifyResult:
    q_all = tree.child_probs
    assert q_all is not None
    ids = tree.token_ids.tolist()
    n = tree.num_nodes
    u = torch.rand(n - 1, generator=generator, device=device).tolist()
    path, tokens = [0], []
    for d in range(n - 1):  # node d proposes its child d + 1
        p = probs_at(d)
        q, x = q_all[d].to(p.device).float(), ids[d + 1]
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
    tokens.append(int(sample(probs_at(n - 1)[None], generator)[0]))  # all accepted: bonus from the last node
    return VerifyResult(path, tokens)


def _rejection_tree(tree: DraftTree, probs_at: ProbsAt, generator: torch.Generator | None, device: torch.device) -> VerifyResult:
    """Recursive rejection over a tree whose children were drawn from child_probs without
    replacement, in node order (ddtree.sample_tree). probs_at(node): [vocab] fp32, the target's
    processed distribution at a node."""
    q_all = tree.child_probs  # [N, vocab] fp32: row i = what node i's children were drawn from
    assert q_all is not None
    q_all = q_all.to(device).float()
    kids = tree.children()
    ids = tree.token_ids.tolist()
    u = torch.rand(tree.num_nodes, generator=generator, device=device).tolist()  # [N]: node i's acceptance draw
    path, tokens, node = [0], [], 0
    while True:
        p, q = probs_at(node), q_all[node]
        nxt = None
        for c in kids[node]:  # in draw order
            x = ids[c]
            px, qx = float(p[x]), float(q[x])
            if qx > 0 and u[c] * qx < px:  # accept with probability min(1, p(x)/q(x))
                nxt = c
                break
            residual = (p - q).clamp_min(0.0)
            total = float(residual.sum())
            if total <= 0:  # p == q: a rejection has probability 0 (rounding); p itself is exact
                break
            p = residual / total
            q = q.clone()
            q[x] = 0.0  # the next sibling was drawn from q without x
            left = float(q.sum())
            if left <= 0:
                break
            q = q / left
        if nxt is None:
            tokens.append(int(sample(p[None], generator)[0]))  # every child rejected: the bonus from the residual
            return VerifyResult(path, tokens)
        path.append(nxt)
        tokens.append(ids[nxt])
        node = nxt
