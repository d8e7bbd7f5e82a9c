"""Why does a DFlash drafting pass cost more at some tree budgets? (stop 20)

On the H200 the shipped drafter's pass took ~0.56-0.60 ms per step for DDTree-8/16/22 but 0.79 ms for
the chain (top-1) and 1.04 ms for DDTree-32 (docs/results/default_drafter_gpu_v7/eval.json). The only
difference inside the pass is K of the top-K read back per depth (DraftGraphs.top_k = the budget; 1
for the chain). This times, at the SmolLM2-135M shape with random weights:
  1. log_softmax + topk(K) over [B-1, vocab] fp32 alone, captured as a CUDA graph, per K;
  2. the whole DraftGraphs pass (3 draft layers, block 16, 512-row draft context, 3 new rows) per
     top_k: replay alone (CUDA events) and replay + read-back of `packed` (host wall clock).

    python bench/draft_topk.py --out draft_topk.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import DEV, build_model, cuda_time, random_drafter, wall_time  # noqa: E402


def topk_alone(vocab: int, rows: int, ks: list[int]) -> dict:
    x = torch.randn(rows, vocab, device=DEV)
    out = {}
    for k in ks:
        def body(k=k):
            lp = torch.log_softmax(x, dim=-1)
            v, i = lp.topk(k, dim=-1)
            return torch.cat((v.double(), i.double()))
        if not torch.cuda.is_available():  # CPU: a smoke run of the script, eager
            out[k] = {"eager_us": wall_time(body, iters=5) * 1e6}
            continue
        g = torch.cuda.CUDAGraph()
        body()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            body()
        out[k] = {"graph_us": cuda_time(g.replay, iters=200) * 1e6}
        if k == 1:
            def body_max():
                lp = torch.log_softmax(x, dim=-1)
                v, i = lp.max(dim=-1, keepdim=True)
                return torch.cat((v.double(), i.double()))
            g2 = torch.cuda.CUDAGraph()
            body_max()
            torch.cuda.synchronize()
            with torch.cuda.graph(g2):
                body_max()
            out["max"] = {"graph_us": cuda_time(g2.replay, iters=200) * 1e6}
        print(f"[topk] k={k}: {out[k]['graph_us']:.1f} us" + (f" (max: {out['max']['graph_us']:.1f} us)" if k == 1 else ""), flush=True)
    return out


@torch.inference_mode()
def draft_pass(model, ks: list[int], context: int, new_rows: int) -> dict:
    out = {}
    for k in ks:
        drafter = random_drafter(model, 3, 16, budget=15 if k == 1 else k, tree=k != 1)  # k = 1: the chain
        width = len(drafter.model.config.target_layer_ids) * model.config.hidden_size
        ctx = torch.randn(context, width, device=model.device, dtype=model.dtype)
        rows = torch.randn(new_rows, width, device=model.device, dtype=model.dtype)
        drafter.static_passes(2048)
        drafter.reset()
        drafter.observe([0] * context, ctx)
        drafter.draft_logits(0)

        def one():
            drafter.observe([0] * new_rows, rows)
            p = drafter._static_pass(0)
            p.packed.cpu()
            drafter.cache.length -= new_rows
            return p

        p = one()
        wall = wall_time(one, iters=100)
        replay = cuda_time(lambda: drafter.graphs.passes[new_rows].replay(), iters=100)
        out[k] = {"top_k": drafter.graphs.top_k, "packed_shape": list(p.packed.shape), "pass_ms": wall * 1e3, "replay_ms": replay * 1e3}
        print(f"[pass] top_k={k}: pass {wall * 1e3:.3f} ms, replay {replay * 1e3:.3f} ms", flush=True)
        drafter = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", default="1,8,16,22,32,48,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--new-rows", type=int, default=3)
    p.add_argument("--out", default="draft_topk.json")
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    t0 = time.time()
    model = build_model("smollm2-135m")
    res = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
           "topk_alone": topk_alone(model.config.vocab_size, 15, ks),
           "draft_pass": draft_pass(model, ks, args.context, args.new_rows)}
    # the same K again, in the other order: a drift check
    res["topk_alone_again"] = topk_alone(model.config.vocab_size, 15, ks[::-1])
    res["seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
