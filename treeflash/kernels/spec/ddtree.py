"""DDTree's best-first search in one GPU program, so that a draft tree is built where the drafter's
candidates already are (spec/device_step.py) instead of on the host after a read-back.

The search is `best_first` below (the reference, which spec/ddtree.py runs on the host;
tests/kernels/spec/test_ddtree_kernel.py checks the kernel against it, node for node): each depth's top-K candidates sorted descending, a prefix
scoring the sum of its log-probabilities, pop the best prefix and push its next sibling and its
first child until `budget` nodes; with `seed_chain` the top-1 chain enters first. Scores are fp64
sums of the same values the host sums, and ties pop in push order, as Python's heap does, so the
trees are identical.

One program holds the frontier in registers: slot s is the s-th push (so "first pushed" is "lowest
slot"), a popped or never-pushed slot scores -inf. It writes, per node i of the budget + 1:

    tokens [N] long   the root, then each node's candidate token
    parents [N] long  -1 for the root; padding nodes (a search that ran out of finite scores) are
                      children of the root
    depths [N] long
    anc    [N] long   bit j set when node j is node i or an ancestor of i (N <= 63)
    count  [1] long   real nodes (the rest is padding, which acceptance must ignore)
"""

from __future__ import annotations

import heapq
import math

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting


@triton.jit
def _pick(idx, j, values):
    """values[j] as a scalar (j a runtime scalar)."""
    return tl.sum(tl.where(idx == j, values, tl.zeros_like(values)), axis=0)


@triton.jit
def _flag(c):
    """A scalar condition as a clean int1 (the interpreter cannot `&` a bare scalar comparison)."""
    return c.to(tl.int32) != 0


@triton.jit
def _ddtree_kernel(LP, IDS, ROOT, TOK, PAR, DEP, ANC, COUNT, MASK, mask_stride,
                   D: tl.constexpr, K: tl.constexpr, BUDGET: tl.constexpr, SEED: tl.constexpr,
                   F: tl.constexpr, NP: tl.constexpr, HAS_MASK: tl.constexpr):
    f = tl.arange(0, F)  # frontier slots
    n = tl.arange(0, NP)  # node ids
    NEG = float("-inf")
    fs = tl.full([F], NEG, tl.float64)  # frontier: score, parent, depth, rank
    fp = tl.zeros([F], tl.int32)
    fd = tl.zeros([F], tl.int32)
    fr = tl.zeros([F], tl.int32)
    ns = tl.zeros([NP], tl.float64)  # nodes: score, parent, depth, rank, ancestors
    npar = tl.where(n == 0, -1, 0)
    nd = tl.zeros([NP], tl.int32)
    nr = tl.zeros([NP], tl.int32)
    one = tl.full([NP], 1, tl.int64)
    nanc = one << n.to(tl.int64)  # padding nodes: the root's children (fixed below), themselves
    nanc = tl.where(n == 0, nanc, nanc | 1)
    zero = tl.program_id(0) * 0  # an int32 scalar tensor: loop-carried counters must not start as constants
    count = zero + 1  # nodes so far (the root)
    pushes = zero
    if SEED:
        alive = zero + 1
        for d in range(1, D + 1):
            score = _pick(n, count - 1, ns) + tl.load(LP + (d - 1) * K).to(tl.float64)
            ok = _flag(alive != 0) & _flag(zero + d <= BUDGET) & _flag(score > NEG)
            at = n == count
            ns = tl.where(at & ok, score, ns)
            npar = tl.where(at & ok, count - 1, npar)
            nd = tl.where(at & ok, d, nd)
            nr = tl.where(at & ok, 0, nr)
            nanc = tl.where(at & ok, _pick(n, count - 1, nanc) | (one << count), nanc)
            count += ok.to(tl.int32)
            alive = ok.to(tl.int32)
        if K > 1:
            for c in range(1, D + 1):  # the chain's second-best siblings, in chain order
                par = c - 1
                score = _pick(n, par, ns) + tl.load(LP + (c - 1) * K + 1).to(tl.float64)
                ok = _flag(c < count) & _flag(score > NEG)
                at = f == pushes
                fs = tl.where(at & ok, score, fs)
                fp = tl.where(at & ok, par, fp)
                fd = tl.where(at & ok, c, fd)
                fr = tl.where(at & ok, 1, fr)
                pushes += ok.to(tl.int32)
    else:
        score = tl.load(LP).to(tl.float64)
        ok = _flag(score > NEG)
        fs = tl.where((f == 0) & ok, score, fs)
        fd = tl.where((f == 0) & ok, 1, fd)
        pushes += ok.to(tl.int32)
    for _ in range(BUDGET):
        best = tl.max(fs, axis=0)
        go = _flag(best > NEG) & _flag(count <= BUDGET)
        slot = tl.min(tl.where(fs == best, f, F), axis=0)
        parent = _pick(f, slot, fp)
        depth = _pick(f, slot, fd)
        rank = _pick(f, slot, fr)
        fs = tl.where((f == slot) & go, NEG, fs)
        node = count
        at = (n == node) & go
        ns = tl.where(at, best, ns)
        npar = tl.where(at, parent, npar)
        nd = tl.where(at, depth, nd)
        nr = tl.where(at, rank, nr)
        nanc = tl.where(at, _pick(n, parent, nanc) | (one << node), nanc)
        count += go.to(tl.int32)
        # next sibling, then first child (push order as the reference)
        sib_ok = go & _flag(rank + 1 < K)
        sib = _pick(n, parent, ns) + tl.load(LP + (depth - 1) * K + rank + 1, mask=sib_ok, other=NEG).to(tl.float64)
        sib_ok = sib_ok & _flag(sib > NEG)
        at = f == pushes
        fs = tl.where(at & sib_ok, sib, fs)
        fp = tl.where(at & sib_ok, parent, fp)
        fd = tl.where(at & sib_ok, depth, fd)
        fr = tl.where(at & sib_ok, rank + 1, fr)
        pushes += sib_ok.to(tl.int32)
        kid_ok = go & _flag(depth < D)
        kid = best + tl.load(LP + depth * K, mask=kid_ok, other=NEG).to(tl.float64)
        kid_ok = kid_ok & _flag(kid > NEG)
        at = f == pushes
        fs = tl.where(at & kid_ok, kid, fs)
        fp = tl.where(at & kid_ok, node, fp)
        fd = tl.where(at & kid_ok, depth + 1, fd)
        fr = tl.where(at & kid_ok, 0, fr)
        pushes += kid_ok.to(tl.int32)
    real = n < count
    npar = tl.where(real, npar, 0)
    nd = tl.where(real, nd, 1)
    tok = tl.load(IDS + tl.maximum(nd - 1, 0) * K + nr, mask=real & (n > 0), other=0).to(tl.int64)
    tok = tl.where(n == 0, tl.load(ROOT).to(tl.int64), tok)
    keep = n < BUDGET + 1
    tl.store(TOK + n, tok, mask=keep)
    tl.store(PAR + n, npar.to(tl.int64), mask=keep)
    tl.store(DEP + n, tl.where(n == 0, 0, nd).to(tl.int64), mask=keep)
    tl.store(ANC + n, nanc, mask=keep)
    tl.store(COUNT, count.to(tl.int64))
    if HAS_MASK:  # the verify's tree mask: row i sees node j iff j is i or an ancestor of i
        bits = ((nanc[:, None] >> n[None, :].to(tl.int64)) & 1) != 0
        tl.store(MASK + n[:, None] * mask_stride + n[None, :], bits, mask=keep[:, None] & keep[None, :])


def ddtree(
    top_lp: torch.Tensor,  # [D, K], each row descending (summed in fp64, as the host sums the read-back values)
    top_ids: torch.Tensor,  # [D, K] long (or fp64 holding ids)
    root: torch.Tensor,  # [1] long
    budget: int,
    seed_chain: bool,
    out: tuple[torch.Tensor, ...] | None = None,  # (tokens, parents, depths, anc [budget + 1], count [1]) to write into
    mask: torch.Tensor | None = None,  # bool [>= N, >= N] (row-contiguous): also the verify's tree mask into [:N, :N]
) -> tuple[torch.Tensor, ...]:
    """-> (tokens, parents, depths, anc, count): the DDTree of `budget` nodes, on the device, with no
    host sync. The reference off CUDA (unless interpreting). The outputs may be views into a graph
    runner's inputs (spec/device_step.py writes the verify's ids, depths and parents, and its tree
    mask, straight from here). top_lp fp32 or fp64: the kernel sums in fp64 either way."""
    d, k = top_lp.shape
    n = budget + 1
    if n > 63:
        raise ValueError(f"ddtree kernel: budget {budget} > 62 (ancestor bitmasks are int64)")
    dev = top_lp.device
    if out is None:
        out = tuple(torch.empty(n, dtype=torch.long, device=dev) for _ in range(4)) + (torch.empty(1, dtype=torch.long, device=dev),)
    if not (top_lp.is_cuda or _interpreting()):
        return ddtree_ref(top_lp, top_ids, root, budget, seed_chain, out, mask)
    tok, par, dep, anc, count = out
    if mask is not None and (mask.dtype != torch.bool or mask.stride(1) != 1 or mask.shape[0] < n or mask.shape[1] < n):
        raise ValueError(f"ddtree: mask must be bool [>= {n}, >= {n}] with contiguous rows")
    pushes = d + 2 * budget + 1
    lp = top_lp if top_lp.dtype in (torch.float32, torch.float64) else top_lp.double()
    _ddtree_kernel[(1,)](lp.contiguous(), top_ids.long().contiguous(), root, tok, par, dep, anc, count,
                         mask if mask is not None else count, mask.stride(0) if mask is not None else 0,
                         D=d, K=k, BUDGET=budget, SEED=seed_chain, F=triton.next_power_of_2(pushes),
                         NP=triton.next_power_of_2(n), HAS_MASK=mask is not None, num_warps=1)
    return out


def ddtree_ref(top_lp, top_ids, root, budget, seed_chain, out, mask=None):
    """The kernel's outputs from `best_first` (reads the candidates back: for CPU runs only)."""
    parents, ranks = best_first(top_lp.double().tolist(), budget, seed_chain)
    ids = top_ids.long().tolist()
    count = len(parents)
    depths = [0] * count
    for i in range(1, count):
        depths[i] = depths[parents[i]] + 1
    n = budget + 1
    tok = [int(root.reshape(-1)[0])] + [ids[depths[i] - 1][ranks[i]] for i in range(1, count)] + [0] * (n - count)
    par = parents + [0] * (n - count)
    dep = depths + [1] * (n - count)
    anc = [1]
    for i in range(1, n):
        anc.append(anc[par[i]] | (1 << i))
    tok_t, par_t, dep_t, anc_t, count_t = out
    dev = tok_t.device
    tok_t.copy_(torch.tensor(tok, device=dev))
    par_t.copy_(torch.tensor(par, device=dev))
    dep_t.copy_(torch.tensor(dep, device=dev))
    anc_t.copy_(torch.tensor(anc, device=dev))
    count_t.fill_(count)
    if mask is not None:
        a = anc_t[:, None] >> torch.arange(n, device=dev)[None, :]
        mask[:n, :n].copy_((a & 1).bool())
    return out


def best_first(top_lp: list[list[float]], budget: int, seed_chain: bool = False) -> tuple[list[int], list[int]]:
    """top_lp[d][r]: log-prob of the rank-r candidate at depth d + 1, each row sorted descending.

    Returns (parents, ranks) of the tree's nodes, root first (parents[0] = -1, ranks[0] = -1).
    Candidates scoring -inf (impossible tokens) never enter. Equal scores pop first-pushed first.
    (Written without helper closures: this runs on the host between the drafter's and the
    target's graphs, once a step.)"""
    num_depths = len(top_lp)
    width = len(top_lp[0]) if num_depths else 0
    parents, ranks, scores, depths = [-1], [-1], [0.0], [0]
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, push order, parent, depth, rank)
    push, pop, inf = heapq.heappush, heapq.heappop, math.inf
    order = 0
    if seed_chain:
        node = 0
        for d in range(1, min(num_depths, budget) + 1):
            score = scores[node] + top_lp[d - 1][0]
            if score == -inf:
                break
            parents.append(node)
            ranks.append(0)
            scores.append(score)
            depths.append(d)
            node = len(parents) - 1
        if width > 1:
            for chain_node in range(1, len(parents)):  # the chain's second-best siblings
                parent, d = parents[chain_node], depths[chain_node]
                score = scores[parent] + top_lp[d - 1][1]
                if score > -inf:
                    push(heap, (-score, order, parent, d, 1))
                    order += 1
    elif num_depths and width:
        score = top_lp[0][0]
        if score > -inf:
            push(heap, (-score, order, 0, 1, 0))
            order += 1
    while heap and len(parents) <= budget:
        neg, _, parent, depth, rank = pop(heap)
        parents.append(parent)
        ranks.append(rank)
        scores.append(-neg)
        depths.append(depth)
        node = len(parents) - 1
        if rank + 1 < width:  # next sibling
            score = scores[parent] + top_lp[depth - 1][rank + 1]
            if score > -inf:
                push(heap, (-score, order, parent, depth, rank + 1))
                order += 1
        if depth < num_depths:  # first child
            score = -neg + top_lp[depth][0]
            if score > -inf:
                push(heap, (-score, order, node, depth + 1, 0))
                order += 1
    return parents, ranks
