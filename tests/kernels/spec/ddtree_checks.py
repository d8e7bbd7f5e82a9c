"""kernels/spec/ddtree.py (the best-first search in one program) against kernels/ddtree.best_first under
TRITON_INTERPRET=1 (run by test_ddtree_kernel.py). Prints one JSON line: case -> None or what differs."""

from __future__ import annotations

import json

import torch


def expected(top_lp, top_ids, root, budget, seed):
    from treeflash.kernels.spec.ddtree import best_first

    parents, ranks = best_first(top_lp.tolist(), budget, seed)
    count = len(parents)
    depths = [0] * count
    tokens = [root]
    for i in range(1, count):
        depths[i] = depths[parents[i]] + 1
        tokens.append(int(top_ids[depths[i] - 1, ranks[i]]))
    n = budget + 1
    par = parents + [0] * (n - count)
    anc = [1]
    for i in range(1, n):
        anc.append(anc[par[i]] | (1 << i))
    return tokens + [0] * (n - count), par, depths + [1] * (n - count), anc, count


def cases():
    g = torch.Generator().manual_seed(0)
    for d, k, budget in [(15, 32, 32), (15, 22, 22), (7, 8, 8), (15, 4, 12), (3, 1, 2), (15, 62, 62), (4, 2, 20)]:
        logits = torch.randn(d, 300, generator=g) * 3
        lp = torch.log_softmax(logits, -1)
        top_lp, top_ids = lp.topk(k, dim=-1)
        yield f"d{d}_k{k}_b{budget}", top_lp.double(), top_ids, budget
    # ties (equal scores pop in push order) and impossible candidates (-inf never enter)
    lp = torch.tensor([[-0.5, -0.5, -2.0, -2.0], [-0.1, -0.1, -0.1, float("-inf")], [-1.0, float("-inf"), float("-inf"), float("-inf")]],
                      dtype=torch.float64)
    yield "ties_and_inf", lp, torch.arange(12).view(3, 4) + 100, 14
    lp = torch.full((3, 4), float("-inf"), dtype=torch.float64)
    lp[0, 0] = -1.0
    yield "runs_out", lp, torch.arange(12).view(3, 4), 6


def main() -> None:
    from treeflash.kernels.spec.ddtree import ddtree, ddtree_ref

    out = {}
    for name, top_lp, top_ids, budget in cases():
        for seed in (False, True):
            want = expected(top_lp, top_ids, 7, budget, seed)
            n = budget + 1
            # the verify's tree mask from the ancestor sets: row i sees j iff j is i or an ancestor of i
            want_mask = [[bool(want[3][i] >> j & 1) for j in range(n)] for i in range(n)]
            # kernel_fp32_mask: fp32 candidates (the device step's; summed in fp64 inside, as the host
            # sums the same fp32 values) and the mask written into a larger buffer, as the runner's
            lp32 = top_lp.float()
            want32 = expected(lp32.double(), top_ids, 7, budget, seed)
            for impl in ("kernel", "ref", "kernel_fp32_mask", "ref_mask"):
                bufs = tuple(torch.zeros(n, dtype=torch.long) for _ in range(4)) + (torch.zeros(1, dtype=torch.long),)
                mask = torch.zeros(n + 3, 70, dtype=torch.bool) if impl.endswith("mask") else None
                if impl.startswith("ref"):
                    got = ddtree_ref(top_lp, top_ids, torch.tensor([7]), budget, seed, bufs, mask)
                else:
                    got = ddtree(lp32 if "fp32" in impl else top_lp, top_ids, torch.tensor([7]), budget, seed, bufs, mask)
                got = tuple(t.tolist() for t in got[:4]) + (int(got[4]),)
                err = None
                for field, a, b in zip(("tokens", "parents", "depths", "anc", "count"), got, want32 if "fp32" in impl else want):
                    if a != b:
                        err = f"{field}: got {a}, want {b}"
                        break
                if err is None and mask is not None:
                    m = want_mask if "fp32" not in impl else [[bool(want32[3][i] >> j & 1) for j in range(n)] for i in range(n)]
                    if mask[:n, :n].tolist() != m or mask[n:].any() or mask[:, n:].any():
                        err = f"mask: got {mask[:n, :n].int().tolist()}"
                out[f"{name}_seed{int(seed)}_{impl}"] = err
    print(json.dumps(out))


if __name__ == "__main__":
    main()
