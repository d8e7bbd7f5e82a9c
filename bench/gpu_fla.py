"""flash-linear-attention's chunked Gated DeltaNet (kernels/gdn/gdn_chunk.py) against our torch reference
(models/gated_deltanet.py: delta_rule_chunked) on the GPU: parity of outputs and final state, then
the time of one layer's delta rule at 4K and 32K tokens, then a hybrid model's prefill both ways.

    PYTHONPATH=/tmp/site python -m bench.gpu_fla --out bench/results/gpu_fla.json   # fla + fla-core + einops in /tmp/site

Parity runs in fp32 state with bf16 q/k/v (what prefill feeds it); the reference gets the same
bf16-rounded inputs, so the difference is the kernels' arithmetic, not the input rounding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


from treeflash.kernels.gdn import gdn_chunk
from treeflash.models.gated_deltanet import delta_rule_chunked, l2norm

HK, HV, DK, DV = 16, 48, 128, 128  # Qwen3.5-27B's linear-attention heads


def inputs(t: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, HK, DK, device="cuda", generator=g).bfloat16()
    k = torch.randn(t, HK, DK, device="cuda", generator=g).bfloat16()
    v = torch.randn(t, HV, DV, device="cuda", generator=g).bfloat16()
    a = torch.randn(t, HV, device="cuda", generator=g)
    logdecay = -torch.exp(torch.randn(HV, device="cuda", generator=g) * 0.5) * F.softplus(a + 1.0)  # [T, Hv], <= 0
    beta = torch.sigmoid(torch.randn(t, HV, device="cuda", generator=g))
    state = torch.randn(HV, DK, DV, device="cuda", generator=g) * 0.05
    return q, k, v, logdecay, beta, state


def reference(q, k, v, g, beta, state):
    group = HV // HK
    qn = (l2norm(q.float()) * DK**-0.5).repeat_interleave(group, dim=1)
    kn = l2norm(k.float()).repeat_interleave(group, dim=1)
    return delta_rule_chunked(qn, kn, v.float(), g, beta, state)


def timed(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@torch.inference_mode()
def model_prefill(n: int, res: dict) -> None:
    """A 27B-shaped hybrid model cut to 4 layers (3 linear-attention, 1 attention), random bf16
    weights: the prefill's last logits and state with fla against the reference, and its speed."""
    from bench.gpu_shapes import SHAPES, build_model  # the real shapes
    from treeflash.models.step import StepInput

    cfg = dict(SHAPES["qwen3.5-27b"])
    cfg.update(num_layers=4, vocab_size=4096, layer_types=cfg["layer_types"][:4])
    SHAPES["qwen3.5-27b-4layers"] = cfg
    model = build_model("qwen3.5-27b-4layers", device="cuda")
    model.fuse_projections()
    ids = torch.randint(0, 4096, (n,), device="cuda")
    out = {}
    for use in (False, True):
        for m in model.modules():  # each Gated DeltaNet layer's own switch
            if hasattr(m, "use_fla"):
                m.use_fla = use
        cache = model.new_cache(n + 8)
        logits = model(StepInput.plain(ids, 0), cache).logits[-1].float()
        states = [c.state.clone() for c in cache.layers if hasattr(c, "state")]

        def run():
            cache.reset()
            model(StepInput.plain(ids, 0), cache, compute_logits=False)

        out[use] = (logits, states, timed(run, 3))
    (l0, s0, t0), (l1, s1, t1) = out[False], out[True]
    res[f"model_prefill_{n}"] = {
        "layers": "4 (3 Gated DeltaNet + 1 attention), 27B widths, bf16",
        "last_logits_rel_err": rel(l1, l0), "state_rel_err": max(rel(a, b) for a, b in zip(s1, s0)),
        "reference_s": t0, "fla_s": t1, "speedup": t0 / t1,
    }
    print(f"model prefill {n}:", res[f"model_prefill_{n}"], flush=True)


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/gpu_fla.json")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 32768])
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    res: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import fla

        res["fla"] = fla.__version__
    except Exception as e:  # noqa: BLE001
        res["error"] = f"fla does not import: {e}"
        Path(args.out).write_text(json.dumps(res, indent=2))
        print(res["error"])
        sys.exit(1)
    ok = True
    for t in (37, 1000, 4096 + 77):  # lengths off the 64-token chunk grid too
        q, k, v, g, beta, state = inputs(t, seed=t)
        o_ref, s_ref = reference(q, k, v, g, beta, state)
        o, s = gdn_chunk.chunk_gated_delta(q, k, v, g, beta, state, torch.bfloat16)
        r = {"out_rel_err": rel(o, o_ref), "state_rel_err": rel(s, s_ref)}
        r["ok"] = r["out_rel_err"] < 2e-2 and r["state_rel_err"] < 2e-2  # bf16 q/k/v inside fla's dots
        ok &= r["ok"]
        res[f"parity_{t}"] = r
        print(f"parity T={t}:", r, flush=True)
    for t in args.lengths:
        q, k, v, g, beta, state = inputs(t)
        t_ref = timed(lambda: reference(q, k, v, g, beta, state), 2)
        t_fla = timed(lambda: gdn_chunk.chunk_gated_delta(q, k, v, g, beta, state, torch.bfloat16), 5)
        res[f"layer_{t}"] = {"reference_ms": t_ref * 1e3, "fla_ms": t_fla * 1e3, "speedup": t_ref / t_fla}
        print(f"one layer T={t}:", res[f"layer_{t}"], flush=True)
        del q, k, v, g, beta, state
        torch.cuda.empty_cache()
    for n in (4096,):
        model_prefill(n, res)
    res["ok"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print("FLA CHECK", "PASSED" if ok else "FAILED", flush=True)


if __name__ == "__main__":
    main()
