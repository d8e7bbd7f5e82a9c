"""Gated DeltaNet verify/decode kernels at the Qwen3.5-27B shape (16 k heads, 48 v heads, 128 x 128 fp32
state): each tree_recurrent variant against the plain-torch reference, the commit path bitwise against
decode steps, then median times (triton.testing.do_bench) for chain-32, a random 32-node tree, a
DDTree-like tree (32 nodes, depth ~6), chain-8/16/64, a 64-node DDTree-like tree (depth ~12) and a
128-node bucket of 20 real + 108 padding nodes: the plain walks against the out_split walks.
A failing variant is recorded, not fatal. Writes JSON to --out and prints a table.

    python -m bench.gdn_kernels_gpu --out gdn_kernels.json                 # the default sweep
    python -m bench.gdn_kernels_gpu --block-v 16 --warps 4 --no-sweep      # the library default only
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path

import torch


from treeflash.kernels.gdn import gdn_tree
from treeflash.kernels.gdn.gdn_decode import conv_step, conv_step_ref, recurrent_step, recurrent_step_ref
from treeflash.kernels.gdn.gdn_tree import recurrent_path, tree_recurrent, tree_recurrent_ref

HK, HV, DK, DV, K = 16, 48, 128, 128, 4
C = 2 * HK * DK + HV * DV


def mask_of(par: list[int], pad: int, dev) -> torch.Tensor:
    buf = torch.zeros(pad, pad, dtype=torch.bool)
    for i, p in enumerate(par):
        if p >= 0:
            buf[i] = buf[p]
        buf[i, i] = True
    return buf.to(dev)[: len(par), : len(par)]


def ddtree(n: int, depth: int, rng: random.Random) -> list[int]:
    """Top-k-like: a best chain of `depth` nodes, the rest siblings hung off early nodes (most leaves)."""
    par = [-1] + list(range(depth - 1))
    while len(par) < n:
        par.append(rng.choice(range(min(len(par), depth))) if rng.random() < 0.7 else rng.randrange(len(par)))
    return par


def trees() -> dict[str, list[int]]:
    rng = random.Random(0)
    return {"chain32": list(range(-1, 31)), "tree32": [-1] + [rng.randrange(i) for i in range(1, 32)],
            "ddtree32": ddtree(32, 6, rng), "chain8": list(range(-1, 7)), "chain16": list(range(-1, 15)),
            "chain64": list(range(-1, 63)), "ddtree64": ddtree(64, 12, rng),
            "pad128": [-1] + [rng.randrange(i) for i in range(1, 20)] + [0] * 108}


def bench(fn) -> float:
    """Median us of one call replayed from a CUDA graph (as the runner runs it: no host overhead)."""
    import triton.testing
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gdn_kernels.json")
    ap.add_argument("--block-v", type=int, nargs="*", default=[16, 32])
    ap.add_argument("--warps", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--no-sweep", action="store_true", help="time the library default only")
    ap.add_argument("--trees", nargs="*", default=None, help="only these trees (chain32 ddtree32 ...)")
    ap.add_argument("--variants", nargs="*", default=None, help="only these variants (default bv32_w2 walk_outsplit_bv16_w1 ...)")
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    t0 = time.time()
    res: dict = {"shape": dict(hk=HK, hv=HV, dk=DK, dv=DV), "defaults": dict(block_v=gdn_tree.TREE_BLOCK_V,
                 warps=gdn_tree.TREE_WARPS, kids_split=gdn_tree.TREE_KIDS_SPLIT,
                 out_split=gdn_tree.TREE_OUT_SPLIT), "tree": {}, "decode": {}, "errors": {}}

    variants = {"default": {}}
    if not args.no_sweep:
        for bv, w in itertools.product(args.block_v, args.warps):
            variants[f"bv{bv}_w{w}"] = dict(block_v=bv, num_warps=w)
        for ks in (1, 2, 8):
            variants[f"bv32_w2_ksplit{ks}"] = dict(block_v=32, num_warps=2, kids_split=ks)
        variants["bv16_w2_ksplit8"] = dict(block_v=16, num_warps=2, kids_split=8)
        variants["bv64_w4"] = dict(block_v=64, num_warps=4)
        variants["bv64_w2"] = dict(block_v=64, num_warps=2)
        for v in list(variants):  # the plain walks above; the default is the out_split walk
            if v != "default":
                variants[v]["out_split"] = False
        for bv, w in ((32, 2), (16, 1), (16, 2)):  # 32 x 1 spills 428 bytes (offline sm_90a compile)
            variants[f"walk_outsplit_bv{bv}_w{w}"] = dict(block_v=bv, num_warps=w, out_split=True)

    if args.variants:
        variants = {k: v for k, v in variants.items() if k in args.variants}
    for name, par in trees().items():
        if args.trees and name not in args.trees:
            continue
        t = len(par)
        pt = torch.tensor(par, device=dev)
        y = torch.randn(t, C, device=dev)
        a, b = torch.randn(t, HV, device=dev), torch.randn(t, HV, device=dev)
        alog, dtb = torch.randn(HV, device=dev) * 0.3, torch.randn(HV, device=dev)
        s0 = torch.randn(HV, DK, DV, device=dev) * 0.1
        m = mask_of(par, 128, dev)
        ref = tree_recurrent_ref(y, a, b, alog, dtb, s0, pt, HK, DK, DV)
        scale = ref.abs().max().item()
        row = res["tree"].setdefault(name, {})
        for vname, kw in variants.items():
            try:
                o = tree_recurrent(y, a, b, alog, dtb, s0, pt, m, HK, DK, DV, **kw)
                torch.cuda.synchronize()
                err = (o - ref).abs().max().item() / scale
                us = bench(lambda: tree_recurrent(y, a, b, alog, dtb, s0, pt, m, HK, DK, DV, **kw))
                row[vname] = dict(us=round(us, 2), rel_err=err, ok=bool(err < 1e-5))
                print(f"[{time.time() - t0:5.1f}s] {name:10s} {vname:20s} {us:8.1f} us  rel err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001 -- record and go on
                res["errors"][f"{name}/{vname}"] = repr(e)[:300]
        # commit path bitwise equal to decode steps along the deepest leaf's path
        leaf = max(range(t), key=lambda i: (m[i].sum().item(), -i))
        path = [int(j) for j in torch.nonzero(m[leaf]).flatten().tolist()]
        s1, s2 = s0.clone(), s0.clone()
        padded = torch.tensor(path + [path[-1]] * (t - len(path)), device=dev)
        recurrent_path(y, a, b, alog, dtb, s1, padded, torch.tensor([len(path)], device=dev), HK, DK, DV)
        for i in path:
            recurrent_step(y[i], a[i], b[i], alog, dtb, s2, HK, DK, DV)
        res["tree"][name]["commit_vs_decode_bitwise"] = bool(torch.equal(s1, s2))

    if not args.trees:  # the decode kernels too (the full run)
        # decode step: conv_step + recurrent_step (two launches), against references
        x = torch.randn(C, device=dev, dtype=torch.bfloat16)
        win, w = torch.randn(C, K - 1, device=dev, dtype=torch.bfloat16), torch.randn(C, K, device=dev, dtype=torch.bfloat16)
        a1, b1 = torch.randn(HV, device=dev), torch.randn(HV, device=dev)
        alog, dtb = torch.randn(HV, device=dev) * 0.3, torch.randn(HV, device=dev)
        s = torch.randn(HV, DK, DV, device=dev) * 0.1
        w1, w2, sa, sb = win.clone(), win.clone(), s.clone(), s.clone()
        yk = conv_step(x, w1, w)
        yr = conv_step_ref(x, w2, w)
        ok = (yk - yr).abs().max().item()
        o1 = recurrent_step(yk, a1, b1, alog, dtb, sa, HK, DK, DV)
        o2 = recurrent_step_ref(yr, a1, b1, alog, dtb, sb, HK, DK, DV)
        res["decode"]["two_kernels_err"] = max(ok, (o1 - o2).abs().max().item() / o2.abs().max().item())
        ws, ss = win.clone(), s.clone()
        res["decode"]["two_kernels_us"] = round(bench(lambda: recurrent_step(conv_step(x, ws, w), a1, b1, alog, dtb, ss, HK, DK, DV)), 2)
        res["decode"]["conv_step_us"] = round(bench(lambda: conv_step(x, ws, w)), 2)
        yk2 = yk.clone()
        res["decode"]["recurrent_step_us"] = round(bench(lambda: recurrent_step(yk2, a1, b1, alog, dtb, ss, HK, DK, DV)), 2)
    res["wall_s"] = round(time.time() - t0, 1)

    Path(args.out).write_text(json.dumps(res, indent=1))
    names = list(variants)
    print(f"{'variant':24s}" + "".join(f"{n:>18s}" for n in res["tree"]))
    for v in names:
        cells = []
        for row in res["tree"].values():
            r = row.get(v)
            cells.append(f"{'ERR' if r is None else ('%.1f' % r['us']) + ('' if r['ok'] else ' BAD'):>18s}")
        print(f"{v:24s}" + "".join(cells))
    print("commit bitwise:", {n: r["commit_vs_decode_bitwise"] for n, r in res["tree"].items()})
    print("decode:", res["decode"])
    if res["errors"]:
        print("errors:", json.dumps(res["errors"], indent=1))
    print(f"wall {res['wall_s']} s -> {args.out}")


if __name__ == "__main__":
    main()
