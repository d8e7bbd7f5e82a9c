"""Which draft tree accepts the most, offline: the drafter's candidates at every position of real
greedy outputs, and every tree policy scored against the target's own continuation.

At temperature 0 the target's continuation after a position does not depend on the tree, so a
tree's acceptance there is fixed by the drafter's per-depth candidates and that continuation: the
longest prefix of it that is a path of the tree. This script
1. decodes the held-out prompts plainly (the default model, fp32 on the CPU by default),
2. runs the target once over each sequence for the drafter's hidden states, then the drafter at
   every output position (context = the tokens before it, root = its token): top-K log-probs and
   ids per depth,
3. scores tree policies at each budget: DDTree's best-first over the drafter's log-probs (what
   treeflash runs), and over log_softmax(logits / T) for other temperatures T (calibration: the
   same candidates, their probabilities sharper or flatter; a constant scale of the log-probs would
   change nothing, since best-first ranks sums), with a bonus per depth (a constant added to every
   log-prob: deeper prefixes gain), seeded with the top-1 chain or not; and with a penalty
   for the nodes below a deviation (`--deviation-penalties`): a block drafter's marginal at depth d is
   conditioned on the context, not on the path, so below a non-top-1 choice its candidates may be
   worth less than their log-probs say. Each step after the path's first non-top-1 choice ("any") or
   once per earlier non-top-1 choice ("count") adds the penalty to the score.

tau is reported two ways: averaged over every position, and along the walk a decoder takes (from
the first output position, jump by accepted + 1). The step's cost does not depend on the policy
(the same budget), so tau ratios are speedup ratios.

    python -m bench.ddtree_policy_sim --num-prompts 20 --max-tokens 128 --out ddtree_policy_sim.json
    python -m bench.ddtree_policy_sim --budgets 32 48 --temps 1.0 --deviation-penalties 0 -0.25 -0.5 -1 \
        --cache sim_rows.safetensors --out ddtree_policy_sim_dev.json   # the candidates kept for later runs
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from pathlib import Path

import torch


from treeflash.data.prompts import encode_prompt
from treeflash.kernels.spec.ddtree import best_first
from treeflash.models.default_model import default_drafter_path, default_model_path
from treeflash.models.loader import load_model
from treeflash.models.step import StepInput
from treeflash.spec.decoder import Decoder
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.dflash_model import load_dflash
from treeflash.spec.sampling import SamplingParams
from treeflash.train.prompts import heldout_prompts


def candidates(loaded, draft, prompt_ids: list[int], max_tokens: int, k: int, temps=(1.0,)):
    """-> (output tokens, per output position p: (top_lp [T, D, k], top_ids [D, k], truth [D])): top_lp[i] =
    log_softmax(logits / temps[i]) at the top-k ids (the same ids at every temperature)."""
    model = loaded.model
    dec = Decoder(model, model.new_cache(len(prompt_ids) + max_tokens + 8), SamplingParams())
    out = [dec.prefill(prompt_ids)]
    while len(out) < max_tokens:
        out.extend(dec.step())
    seq = prompt_ids + out[:max_tokens]
    drafter = DFlashDrafter(model, draft, budget=k, tree=True)
    hidden = model(StepInput.plain(torch.tensor(seq), 0), model.new_cache(len(seq) + 1),
                   capture_layers=drafter.capture_layers).captured  # [S, C]
    d = drafter.max_depth
    p0 = len(prompt_ids)
    drafter.observe(seq[:p0], hidden[:p0])
    rows = []
    for p in range(p0, len(seq) - d):
        logits = drafter.draft_logits(seq[p])  # context seq[:p], root seq[p]
        _, top_ids = logits.topk(k, dim=-1)
        top_lp = torch.stack([torch.log_softmax(logits / t, dim=-1).gather(1, top_ids) for t in temps])
        rows.append((top_lp, top_ids, torch.tensor(seq[p + 1 : p + 1 + d])))
        drafter.observe([seq[p]], hidden[p : p + 1])
    return out, rows


def best_first_dev(top_lp: list[list[float]], budget: int, penalty: float, mode: str) -> tuple[list[int], list[int]]:
    """Unseeded best-first (kernels/ddtree.best_first) where a step below a non-top-1 choice scores `penalty`
    more ("any": once a step after the first deviation; "count": once a step per earlier deviation). Siblings
    share their parent's deviations, so they stay in log-prob order and the lazy sibling / first-child pushes
    still pop nodes best first."""
    depths_n, width = len(top_lp), len(top_lp[0])
    parents, ranks, scores, devs = [-1], [-1], [0.0], [0]
    heap = [(-top_lp[0][0], 0, 0, 1, 0)]  # (-score, push order, parent, depth, rank)
    order = 1

    def extra(dev: int) -> float:
        return penalty * (min(dev, 1) if mode == "any" else dev)

    while heap and len(parents) <= budget:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        parents.append(parent)
        ranks.append(rank)
        scores.append(-neg)
        dev = devs[parent] + (rank > 0)
        devs.append(dev)
        if rank + 1 < width:
            heapq.heappush(heap, (-(scores[parent] + top_lp[depth - 1][rank + 1] + extra(devs[parent])), order, parent, depth, rank + 1))
            order += 1
        if depth < depths_n:
            heapq.heappush(heap, (-(-neg + top_lp[depth][0] + extra(dev)), order, len(parents) - 1, depth + 1, 0))
            order += 1
    return parents, ranks


def accepted(top_lp, top_ids, truth, budget: int, seed: bool, penalty: float = 0.0, mode: str = "any") -> int:
    if penalty:
        parents, ranks = best_first_dev(top_lp.tolist(), budget, penalty, mode)
    else:
        parents, ranks = best_first(top_lp.tolist(), budget, seed)
    ids = top_ids.tolist()
    kids: dict[int, list[int]] = {}
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
        kids.setdefault(parents[i], []).append(i)
    node, n = 0, 0
    for t in truth.tolist():
        nxt = next((c for c in kids.get(node, []) if ids[depth[c] - 1][ranks[c]] == t), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def save_rows(path: str, seqs, temps) -> None:
    """The candidates as safetensors (no pickles): per prompt i, lp [N, T, D, k], ids [N, D, k], truth [N, D]."""
    from safetensors.torch import save_file

    tensors, names = {}, []
    for i, (name, rows) in enumerate(seqs):
        names.append(name)
        tensors[f"{i}.lp"] = torch.stack([r[0] for r in rows]).contiguous()
        tensors[f"{i}.ids"] = torch.stack([r[1] for r in rows]).contiguous()
        tensors[f"{i}.truth"] = torch.stack([r[2] for r in rows]).contiguous()
    save_file(tensors, path, metadata={"names": json.dumps(names), "temps": json.dumps(list(temps))})


def load_rows(path: str, k: int, num_temps: int):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, "pt") as f:
        meta = f.metadata()
    tensors, names = load_file(path), json.loads(meta["names"])
    if len(json.loads(meta["temps"])) != num_temps:
        raise SystemExit(f"{path} holds {len(json.loads(meta['temps']))} temperatures; pass the same --temps as the run that wrote it")
    seqs = []
    for i, name in enumerate(names):
        lp, ids, truth = tensors[f"{i}.lp"][..., :k], tensors[f"{i}.ids"][..., :k], tensors[f"{i}.truth"]
        seqs.append((name, list(zip(lp, ids, truth))))
    return seqs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the embedded default model")
    p.add_argument("--drafter", default=None, help="default: the shipped drafter")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 48])
    p.add_argument("--temps", type=float, nargs="+", default=[1.0, 0.8, 1.25, 1.5, 2.0])
    p.add_argument("--bonuses", type=float, nargs="+", default=[0.0],
                   help="added to every candidate's log-prob: a node at depth d scores d * bonus more (> 0 favors depth)")
    p.add_argument("--deviation-penalties", type=float, nargs="+", default=[0.0],
                   help="added to a node's score per step below a non-top-1 choice (unseeded trees; < 0 trusts such paths less)")
    p.add_argument("--deviation-modes", nargs="+", default=["any"], choices=["any", "count"])
    p.add_argument("--seeds", default="1,0", help="seed_chain values to score (1: seeded, 0: not)")
    p.add_argument("--cache", default=None, help="a safetensors file of the candidates: written on the first run, read after")
    p.add_argument("--out", default="ddtree_policy_sim.json")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    k = max(args.budgets)
    if args.cache and Path(args.cache).exists():
        seqs = load_rows(args.cache, k, len(args.temps))
        print(f"[sim] candidates from {args.cache}: {len(seqs)} prompts", flush=True)
    else:
        loaded = load_model(args.model or default_model_path(), device="cpu", dtype=getattr(torch, args.dtype), progress=False)
        draft = load_dflash(args.drafter or default_drafter_path(), "cpu", loaded.model.dtype)
        t0 = time.perf_counter()
        seqs = []
        for i, prompt in enumerate(heldout_prompts()[: args.num_prompts]):
            _, rows = candidates(loaded, draft, encode_prompt(loaded, prompt), args.max_tokens, k, tuple(args.temps))
            seqs.append((prompt.name, rows))
            print(f"[sim] {i + 1}/{args.num_prompts} {prompt.name}: {len(rows)} positions ({time.perf_counter() - t0:.0f} s)", flush=True)
        if args.cache:
            save_rows(args.cache, seqs, args.temps)
    results = []
    policies = [(seed, pen, mode) for seed in (bool(int(x)) for x in args.seeds.split(","))
                for pen in args.deviation_penalties for mode in (args.deviation_modes if pen else ["any"])
                if not (seed and pen)]  # the penalty is for unseeded trees
    for budget in args.budgets:
        for seed, pen, mode in policies:
            for (ti, temp), bonus in ((t, b) for t in enumerate(args.temps) for b in args.bonuses):
                acc_all, walk_tau = [], []
                for _, rows in seqs:
                    acc = [accepted(lp[ti] + bonus, ids, tr, budget, seed, pen, mode) for lp, ids, tr in rows]
                    acc_all += acc
                    pos, steps, made = 0, 0, 0
                    while pos < len(acc):
                        steps, made = steps + 1, made + acc[pos] + 1
                        pos += acc[pos] + 1
                    walk_tau.append((steps, made))
                row = {"budget": budget, "seed_chain": seed, "temperature": temp, "depth_bonus": bonus,
                       "deviation_penalty": pen, "deviation_mode": mode,
                       "tau_all_positions": round(1 + sum(acc_all) / len(acc_all), 4),
                       "tau_walk": round(sum(m for _, m in walk_tau) / sum(s for s, _ in walk_tau), 4)}
                results.append(row)
                print(f"[sim] budget {budget:2d} seed {int(seed)} T {temp:.2f} bonus {bonus:+.2f} dev {pen:+.2f} {mode}: tau {row['tau_all_positions']:.3f} "
                      f"(walk {row['tau_walk']:.3f})", flush=True)
    Path(args.out).write_text(json.dumps({"model": args.model or "default", "dtype": args.dtype, "prompts": [n for n, _ in seqs],
                                          "max_tokens": args.max_tokens, "top_k": k, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
