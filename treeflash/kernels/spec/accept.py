"""A device DDTree step's acceptance and bookkeeping in one launch (spec/device_step.py), beside its
plain-torch reference.

After the verify, the step decides which drafted nodes the target agrees with and writes what the
next graphs read: the runner's commit inputs, the host's result row and the step's own state. In
torch that was ~35 small kernels (~2.5 us each inside the step graph on the H200); here one
program does it for the whole tree (t <= 64 nodes):

    ok[i]       node i's token is the target's token at its parent (node 0, the root, always), and
                i is a real node (i < real)
    accepted[i] node i and every ancestor are ok (anc: ancestor bitmasks, the node itself included)
    acc         accepted nodes - 1: the drafts kept (the accepted nodes form one root path)
    path[j]     the accepted node at depth j for j <= acc, then the deepest one repeated
    bonus       the target's token at the deepest accepted node
    emitted     drafts 1 .. acc of the path, then the bonus (at index acc)

Writes, with start = state[0] read first:
    commit[0:t] = start + path, commit[tm:tm+t] = start + 0..t-1, commit[2tm] = acc + 1
    path_out[0:t] = path
    result[0:3] = acc, the deepest real node's depth, real - 1; result[head:head+t] = emitted (padded
                  as the reference pads it)
    state = [start + acc + 1, bonus, acc + 1]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting


def tree_accept_reference(ids, parents, depths, anc, real, target, state, result, commit, path_out, tm: int, head: int) -> None:
    """The torch version (and the CPU path). ids, parents, depths, anc, target: [t] long; real: [1]
    long; state [3], result [head + t], commit [>= 2 tm + 1], path_out [t]: long, written in place."""
    t = ids.shape[0]
    node = torch.arange(t, device=ids.device)
    ok = (ids == target.gather(0, parents.clamp_min(0))) & (node < real)
    ok = ok | (node == 0)
    ok_bits = (ok.long() << node).sum(0, keepdim=True)
    accepted = (anc & ~ok_bits) == 0  # [t]: the node and every ancestor carry the target's token
    acc = accepted.long().sum(0, keepdim=True) - 1  # [1]
    by_depth = torch.zeros(t + 1, dtype=torch.long, device=ids.device)  # slot t takes the rest
    by_depth.scatter_(0, torch.where(accepted, depths, t), node)
    end = by_depth.gather(0, acc)  # the deepest accepted node
    path = torch.where(node <= acc, by_depth[:t], end)
    max_depth = torch.where(node < real, depths, 0).amax(0, keepdim=True)
    bonus = target.gather(0, path[t - 1 :])  # path is padded with its end, so its last entry is the end
    emitted = torch.cat((ids.gather(0, path[1:]), bonus)).scatter(0, acc, bonus)  # drafts 1 .. a, the bonus at a
    start = state[0:1].clone()
    commit[0:t].copy_(start + path)
    commit[tm : tm + t].copy_(start + node)
    commit[2 * tm : 2 * tm + 1].copy_(acc + 1)
    path_out.copy_(path)
    result[0:1].copy_(acc)
    result[1:2].copy_(max_depth)
    result[2:3].copy_(real - 1)
    result[head:].copy_(emitted)
    state[0:1].add_(acc + 1)
    state[1:2].copy_(bonus)
    state[2:3].copy_(acc + 1)


@triton.jit
def _tree_accept_kernel(IDS, PARENTS, DEPTHS, ANC, REAL, TARGET, STATE, RESULT, COMMIT, PATH,
                        T: tl.constexpr, T2: tl.constexpr, TM: tl.constexpr, HEAD: tl.constexpr):
    i = tl.arange(0, T2)  # node (and, below, depth) index
    valid = i < T
    ids = tl.load(IDS + i, mask=valid, other=0)
    par = tl.load(PARENTS + i, mask=valid, other=0)
    dep = tl.load(DEPTHS + i, mask=valid, other=0)
    anc = tl.load(ANC + i, mask=valid, other=0)
    real = tl.load(REAL)
    start = tl.load(STATE)
    at_parent = tl.load(TARGET + tl.maximum(par, 0), mask=valid, other=-1)
    ok = (((ids == at_parent) & (i < real)) | (i == 0)) & valid
    one = tl.full([T2], 1, tl.int64)
    ok_bits = tl.sum(tl.where(ok, one << i.to(tl.int64), 0), axis=0)
    accepted = ((anc & ~ok_bits) == 0) & valid
    acc = tl.sum(accepted.to(tl.int64), axis=0) - 1
    # path[j]: the accepted node of depth j ([depth j, node i] matrix; the accepted nodes have distinct depths)
    hit = accepted[None, :] & (dep[None, :] == i.to(dep.dtype)[:, None])
    by_depth = tl.sum(tl.where(hit, i[None, :].to(tl.int64), 0), axis=1)
    end = tl.sum(tl.where(i == acc, by_depth, 0), axis=0)
    path = tl.where(i <= acc, by_depth, end)
    hit_next = accepted[None, :] & (dep[None, :] == (i + 1).to(dep.dtype)[:, None])
    path_next = tl.where(i + 1 <= acc, tl.sum(tl.where(hit_next, i[None, :].to(tl.int64), 0), axis=1), end)
    max_depth = tl.max(tl.where((i < real) & valid, dep, 0), axis=0)
    bonus = tl.load(TARGET + end)
    emitted = tl.load(IDS + path_next, mask=i < T - 1, other=0)
    emitted = tl.where(i < T - 1, emitted, bonus)
    emitted = tl.where(i == acc, bonus, emitted)
    tl.debug_barrier()  # every thread has read the state before any writes it
    tl.store(COMMIT + i, start + path, mask=valid)
    tl.store(COMMIT + TM + i, start + i, mask=valid)
    tl.store(COMMIT + 2 * TM, acc + 1)
    tl.store(PATH + i, path, mask=valid)
    tl.store(RESULT, acc)
    tl.store(RESULT + 1, max_depth)
    tl.store(RESULT + 2, real - 1)
    tl.store(RESULT + HEAD + i, emitted, mask=valid)
    tl.store(STATE, start + acc + 1)
    tl.store(STATE + 1, bonus)
    tl.store(STATE + 2, acc + 1)


def tree_accept(ids, parents, depths, anc, real, target, state, result, commit, path_out, tm: int, head: int) -> None:
    """One launch on CUDA (or under TRITON_INTERPRET), the reference elsewhere; same contract as
    tree_accept_reference. t = ids.shape[0] <= 64 (anc is an int64 bitmask per node)."""
    t = ids.shape[0]
    if not (ids.is_cuda or _interpreting()):
        return tree_accept_reference(ids, parents, depths, anc, real, target, state, result, commit, path_out, tm, head)
    if not 2 <= t <= 64 or result.shape[0] != head + t or commit.shape[0] < 2 * tm + 1 or tm < t:
        raise ValueError(f"tree_accept: 2 <= t <= 64 nodes, result [head + t], commit [>= 2 tm + 1]; got t {t}, "
                         f"result {tuple(result.shape)}, commit {tuple(commit.shape)}, tm {tm}")
    for name, x in (("ids", ids), ("parents", parents), ("depths", depths), ("anc", anc), ("target", target),
                    ("state", state), ("result", result), ("commit", commit), ("path_out", path_out), ("real", real)):
        if x.dtype != torch.long or not x.is_contiguous():
            raise ValueError(f"tree_accept: {name} must be contiguous int64")
    _tree_accept_kernel[(1,)](ids, parents, depths, anc, real, target, state, result, commit, path_out,
                              T=t, T2=triton.next_power_of_2(t), TM=tm, HEAD=head, num_warps=4)
