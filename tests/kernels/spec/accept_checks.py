"""kernels/spec/accept.py's tree_accept against its reference under TRITON_INTERPRET=1 (run by
test_accept.py). Prints one JSON line: case -> None (every output equal) or what differed."""

from __future__ import annotations

import json

import torch


def random_tree(t: int, vocab: int, gen: torch.Generator):
    """A random draft tree of t nodes (node 0 the root; each parent before its child), its ancestor
    bitmasks (the node itself included), tokens (distinct among siblings) and the target's tokens over
    a small vocabulary (so that paths through siblings get accepted), and a real-node count."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
    depths, anc = [0] * t, [1] + [0] * (t - 1)
    for i in range(1, t):
        depths[i] = depths[parents[i]] + 1
        anc[i] = anc[parents[i]] | (1 << i)
    anc = [a - (1 << 64) if a >= 1 << 63 else a for a in anc]  # int64 bit patterns
    # siblings carry distinct tokens, as in a DDTree (so at most one child of a node matches the target):
    # the k-th child of p gets (offset_p + k) mod v, v >= the most children any node has
    children: dict[int, int] = {}
    rank = [0] * t
    for i in range(1, t):
        rank[i] = children.get(parents[i], 0)
        children[parents[i]] = rank[i] + 1
    v = max([vocab, *children.values()])
    offset = torch.randint(0, v, (t,), generator=gen).tolist()
    ids = torch.tensor([0] + [(offset[parents[i]] + rank[i]) % v for i in range(1, t)])
    target = torch.randint(0, v, (t,), generator=gen)
    node = int(torch.randint(0, t, (1,), generator=gen))  # the target agrees along most of a random root path
    while node > 0:
        if float(torch.rand(1, generator=gen)) < 0.85:
            target[parents[node]] = ids[node]
        node = parents[node]
    real = torch.randint(1, t + 1, (1,), generator=gen)
    return ids, torch.tensor(parents), torch.tensor(depths), torch.tensor(anc, dtype=torch.long), real, target


def main() -> None:
    from treeflash.kernels.spec.accept import tree_accept, tree_accept_reference

    gen = torch.Generator().manual_seed(0)
    out = {}
    deep = 0  # cases whose reference kept at least two drafts
    head, tm = 3, 64
    for t, vocab, seeds in [(2, 2, 6), (5, 2, 6), (17, 2, 6), (33, 3, 6), (49, 2, 4), (63, 2, 4), (33, 50, 3)]:
        for s in range(seeds):
            ids, parents, depths, anc, real, target = random_tree(t, vocab, gen)
            state = torch.tensor([100 + s, 7, 3])
            bufs = [(state.clone(), torch.full((head + t,), -5), torch.full((2 * tm + 4,), -5), torch.full((t,), -5)) for _ in range(2)]
            tree_accept(ids, parents, depths, anc, real, target, *bufs[0], tm, head)
            tree_accept_reference(ids, parents, depths, anc, real, target, *bufs[1], tm, head)
            deep += int(bufs[1][1][0]) >= 2
            bad = [name for name, a, b in zip(("state", "result", "commit", "path"), bufs[0], bufs[1]) if not torch.equal(a, b)]
            out[f"t{t}_v{vocab}_s{s}"] = None if not bad else f"{bad}: kernel {[b.tolist() for b in bufs[0]]} reference {[b.tolist() for b in bufs[1]]}"
    out["deep_paths"] = None if deep >= 5 else f"only {deep} cases kept 2+ drafts: the cases test little"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
