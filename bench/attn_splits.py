"""How the graphed dense attention (kernels/quant_attention.quant_attention_masked over a bf16 cache,
the path a CUDA-graph step takes) should split its keys at the embedded default's shape: SmolLM2-135M,
9 query / 3 KV heads, head_dim 64, 30 layers. Each call is timed inside a CUDA graph of all 30 layers'
calls (triton.testing.do_bench_cudagraph: launch overhead out, the gaps between kernels in), for
T query tokens (1 = decode, 16 = a chain's verify, 33 = DDTree-32's), a cache buffer of max_len
slots of which `context` are filled (the CLI's buffer is 8193 slots, the evaluation's ~600), and the
variants of `variants()`: split counts over the buffer, balanced splits over the filled blocks, launch
configurations. Every variant is first checked against the plain-torch reference.

    python bench/attn_splits.py --out attn_splits.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from treeflash.kernels.kv_quant import Planes  # noqa: E402
from treeflash.kernels.quant_attention import quant_attention_masked, quant_attention_masked_reference  # noqa: E402

LAYERS, HEADS, KV_HEADS, D = 30, 9, 3, 64


def variants(tokens: int, sweep: bool) -> list[tuple[str, dict]]:
    """(label, quant_attention_masked keyword arguments): plan_splits' choice over the buffer ("auto"),
    forced split counts over the buffer ("sN"), balanced splits over the filled blocks ("balN"), and with
    `sweep` the launch configurations (block_m, block_n, warps) at auto and bal4."""
    from treeflash.kernels.attention_launch import LaunchConfig, launch_config

    out = [("auto", {})] + [(f"s{n}", {"num_splits": n}) for n in (1, 2, 4)]
    out += [(f"bal{n}", {"num_splits": n, "balanced": True}) for n in (2, 3, 4, 6, 8, 16)]
    if sweep:
        base = launch_config(D, tokens * HEADS // KV_HEADS, dense_kv=True)
        for bm in (16, 32, 64):
            for bn in (32, 64):
                for w in (2, 4):
                    cfg = LaunchConfig(bm, bn, w, base.num_stages, base.programs_per_sm, prefetch=False)
                    for lab, kw in (("auto", {}), ("bal4", {"num_splits": 4, "balanced": True})):
                        out.append((f"{lab}_m{bm}_n{bn}_w{w}", {**kw, "config": cfg}))
    return out


def run(tokens: int, max_len: int, context: int, sweep: bool) -> dict:
    from triton.testing import do_bench_cudagraph

    dev, dt = "cuda", torch.bfloat16
    ks = [torch.randn(max_len, KV_HEADS, D, device=dev, dtype=dt) for _ in range(LAYERS)]
    vs = [torch.randn(max_len, KV_HEADS, D, device=dev, dtype=dt) for _ in range(LAYERS)]
    q = torch.randn(tokens, HEADS, D, device=dev, dtype=dt)
    mask = torch.zeros(tokens, max_len, dtype=torch.bool, device=dev)
    mask[:, :context] = True
    tree = torch.rand(tokens, tokens, device=dev) < 0.3
    mask[:, context:context + tokens] = tree | torch.eye(tokens, dtype=torch.bool, device=dev)
    slots = torch.arange(context, context + tokens, device=dev)
    planes = [(Planes("bf16", None, k), Planes("bf16", None, v)) for k, v in zip(ks, vs)]
    ref = quant_attention_masked_reference(q, *planes[0], mask, D**-0.5).float()
    out = {"tokens": tokens, "max_len": max_len, "context": context}
    for label, kw in variants(tokens, sweep):
        try:
            y = quant_attention_masked(q, *planes[0], mask, D**-0.5, slots=slots, **kw).float()
            err = (y - ref).abs().max().item()

            def calls(kw=kw):
                for kp, vp in planes:
                    quant_attention_masked(q, kp, vp, mask, D**-0.5, slots=slots, **kw)

            us = do_bench_cudagraph(calls, rep=30, return_mode="median") * 1e3 / LAYERS
            out[label] = {"us": round(us, 2), "max_err": err}
        except Exception as e:  # one configuration must not end the sweep
            out[label] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,16,33")
    p.add_argument("--max-len", default="600,8193")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--sweep", default="33", help="token counts whose runs also sweep launch configurations ('' for none)")
    p.add_argument("--out", default="attn_splits.json")
    args = p.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "runs": []}
    for ml in (int(x) for x in args.max_len.split(",")):
        for t in (int(x) for x in args.tokens.split(",")):
            r = run(t, ml, args.context, str(t) in args.sweep.split(","))
            res["runs"].append(r)
            timed = {k: v for k, v in r.items() if isinstance(v, dict) and "us" in v}
            best = sorted(timed, key=lambda k: timed[k]["us"])[:4]
            print(f"T={t:3d} max_len {ml:5d} ctx {args.context}: auto {timed['auto']['us']:.2f} us; " +
                  " ".join(f"{k} {timed[k]['us']:.2f}" for k in [k for k in timed if not k.startswith(('auto_', 'bal4_'))][1:]) +
                  "; best " + ", ".join(f"{k} {timed[k]['us']:.2f} (err {timed[k]['max_err']:.0e})" for k in best), flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
