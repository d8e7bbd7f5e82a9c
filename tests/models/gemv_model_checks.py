"""A tiny hybrid model's decode steps with its projections on gemv, with and without the residual
add + RMSNorm as the GEMV's epilogue (kernels/gemv.py: project / gemv_add_norm), against cuBLAS-free
plain torch. Run under TRITON_INTERPRET=1 by tests/models/test_gemv_epilogue.py; prints one JSON line."""

from __future__ import annotations

import json

import torch

from tests.models.test_gated_deltanet import tiny_model
from treeflash.kernels import gemv
from treeflash.models.step import StepInput


def decode_logits(model, ids, steps: int) -> tuple[torch.Tensor, int]:
    calls = []
    orig = gemv.gemv_add_norm

    def counted(*a, **kw):
        calls.append(1)
        return orig(*a, **kw)

    gemv.gemv_add_norm = counted
    try:
        cache = model.new_cache(64)
        model(StepInput.plain(ids[:10], 0), cache)
        out = []
        for t in range(10, 10 + steps):
            out.append(model(StepInput.plain(ids[t : t + 1], t), cache).logits)
        return torch.cat(out), len(calls)
    finally:
        gemv.gemv_add_norm = orig


def prologue_main() -> None:
    """The residual add + RMSNorm as the prologue of the fused qkv / in_proj / gate_up GEMVs
    (gemv.NORM_PROLOGUE): decode logits against plain torch, and how many projections ran one."""
    torch.manual_seed(0)
    model = tiny_model().fuse_projections()
    for layer in model.model.layers:  # the tiny input projections join the tables
        w = layer.self_attn.qkv_weight if hasattr(layer, "self_attn") else layer.linear_attn.in_proj
        gemv.TUNED[tuple(w.shape)] = gemv.GemvConfig(8, 16, 1, 2)
    gemv.TUNED_SWIGLU[tuple(model.model.layers[0].mlp.gate_up.shape)] = gemv.GemvConfig(8, 16, 1, 2)
    ids = torch.randint(0, 61, (16,))
    calls = []
    orig_gemv, orig_swiglu = gemv.gemv, gemv.gemv_swiglu

    def gemv_counted(*a, **kw):
        calls.append(kw.get("norm_in") is not None)
        return orig_gemv(*a, **kw)

    def swiglu_counted(*a, **kw):
        calls.append(kw.get("norm_in") is not None)
        return orig_swiglu(*a, **kw)

    gemv.gemv, gemv.gemv_swiglu = gemv_counted, swiglu_counted
    try:
        with torch.no_grad():
            gemv.USE_GEMV, gemv.NORM_PROLOGUE = False, False
            ref, _ = decode_logits(model, ids, 5)
            gemv.USE_GEMV = True
            calls.clear()
            plain, _ = decode_logits(model, ids, 5)
            n_plain = sum(calls)
            gemv.NORM_PROLOGUE = gemv.NORM_PROLOGUE_SWIGLU = True
            calls.clear()
            fused, _ = decode_logits(model, ids, 5)
            n_fused = sum(calls)
            gemv.NORM_PROLOGUE_SWIGLU = False  # qkv / in_proj only: gate_up's norm runs alone
            calls.clear()
            qkv_only, _ = decode_logits(model, ids, 5)
            n_qkv = sum(calls)
    finally:
        gemv.gemv, gemv.gemv_swiglu, gemv.NORM_PROLOGUE, gemv.NORM_PROLOGUE_SWIGLU = orig_gemv, orig_swiglu, False, False
    print(json.dumps({"gemv_err": (plain - ref).abs().max().item(), "prologue_err": (fused - ref).abs().max().item(),
                      "qkv_only_err": (qkv_only - ref).abs().max().item(), "qkv_only_calls": n_qkv,
                      "scale": ref.abs().max().item(), "prologue_calls_plain": n_plain, "prologue_calls": n_fused,
                      "layers": len(model.model.layers)}))


def rows_main() -> None:
    """Rows mode (gemv.ROWS_MAX): a 5-token step (as a chain verify) runs its projections on the
    GEMVs row by row; logits against plain torch, and how many multi-row GEMV calls ran."""
    torch.manual_seed(0)
    model = tiny_model().fuse_projections()
    gemv.TUNED[(32, 32)] = gemv.GemvConfig(8, 32, 1, 4)
    gemv.TUNED[(32, 64)] = gemv.GemvConfig(8, 16, 1, 2)
    gemv.TUNED_SWIGLU[(128, 32)] = gemv.GemvConfig(8, 16, 1, 2)
    ids = torch.randint(0, 61, (16,))
    rows = []
    orig_gemv, orig_swiglu = gemv.gemv, gemv.gemv_swiglu

    def counted(fn):
        def run(x, *a, **kw):
            rows.append(x.shape[0] if x.dim() == 2 else 1)
            return fn(x, *a, **kw)
        return run

    def step(model):
        cache = model.new_cache(64)
        model(StepInput.plain(ids[:10], 0), cache)
        return model(StepInput.plain(ids[10:15], 10), cache).logits

    gemv.gemv, gemv.gemv_swiglu = counted(orig_gemv), counted(orig_swiglu)
    try:
        with torch.no_grad():
            gemv.USE_GEMV, gemv.ROWS_MAX = False, 0
            ref = step(model)
            gemv.USE_GEMV, gemv.ROWS_MAX = True, 8
            rows.clear()
            got = step(model)
    finally:
        gemv.gemv, gemv.gemv_swiglu, gemv.ROWS_MAX = orig_gemv, orig_swiglu, 0
    print(json.dumps({"rows_err": (got - ref).abs().max().item(), "scale": ref.abs().max().item(),
                      "multi_row_calls": sum(1 for r in rows if r == 5), "calls": len(rows), "layers": len(model.model.layers)}))


def main() -> None:
    torch.manual_seed(0)
    model = tiny_model().fuse_projections()
    # the tiny shapes join the tuned table: o_proj / out_proj [32, 32], down [32, 64] (split-K 2)
    gemv.TUNED[(32, 32)] = gemv.GemvConfig(8, 32, 1, 4)
    gemv.TUNED[(32, 64)] = gemv.GemvConfig(8, 16, 2, 2)
    gemv.TUNED_SWIGLU[(128, 32)] = gemv.GemvConfig(8, 16, 1, 2)  # gate_up [2 x 64, 32]
    ids = torch.randint(0, 61, (16,))
    with torch.no_grad():
        gemv.USE_GEMV = False
        ref, _ = decode_logits(model, ids, 5)
        gemv.USE_GEMV, gemv.NORM_EPILOGUE = True, False
        plain, n_plain = decode_logits(model, ids, 5)
        gemv.NORM_EPILOGUE = True
        fused, n_fused = decode_logits(model, ids, 5)
    print(json.dumps({"gemv_err": (plain - ref).abs().max().item(), "epilogue_err": (fused - ref).abs().max().item(),
                      "scale": ref.abs().max().item(), "epilogue_calls_plain": n_plain, "epilogue_calls": n_fused}))


def folded_decode_main() -> None:
    """Every step through forward_folded (fuse_projections(folded_decode=True): the gains folded into the
    fused q/k/v and gate/up weights in place): on one-token steps those on gemv / gemv_swiglu (1 / rms from
    its own pass), o_proj and down adding into the stream in gemv's epilogue (down with split-K), the rotary
    kernel's 1 / rms; logits of 5 decode steps after a 10-token (folded) prefill against transformers' full
    forward (fp32), for llama and qwen3 (q/k norms)."""
    from tests.models.hf_oracle import make_pair

    result = {}
    for arch in ("llama", "qwen3"):
        torch.manual_seed(0)
        hf, ours = make_pair(arch)
        ours.fuse_projections(folded_rows=0, folded_decode=True)
        layer = ours.model.layers[0]
        hidden = layer.self_attn.o_proj.weight.shape[0]
        gemv.TUNED[tuple(layer.self_attn.qkv_folded.shape)] = gemv.GemvConfig(8, 16, 1, 2)
        gemv.TUNED[tuple(layer.self_attn.o_proj.weight.shape)] = gemv.GemvConfig(8, 32, 1, 4)
        gemv.TUNED[tuple(layer.mlp.down_proj.weight.shape)] = gemv.GemvConfig(8, 16, 2, 2)  # split-K: the reducer adds
        gemv.TUNED_SWIGLU[tuple(layer.mlp.gate_up_folded.shape)] = gemv.GemvConfig(8, 16, 1, 2)
        ids = torch.randint(0, 97, (15,))
        calls = {"add": 0, "rows": 0}
        orig_gemv, orig_swiglu = gemv.gemv, gemv.gemv_swiglu

        def gemv_counted(*a, **kw):
            calls["add"] += kw.get("add_into") is not None
            return orig_gemv(*a, **kw)

        def swiglu_counted(*a, **kw):
            calls["rows"] += kw.get("rows") is not None
            return orig_swiglu(*a, **kw)

        gemv.gemv, gemv.gemv_swiglu = gemv_counted, swiglu_counted
        try:
            with torch.inference_mode():
                ref = hf(ids[None]).logits[0, 10:15].float()
                cache = ours.new_cache(64)
                ours(StepInput.plain(ids[:10], 0), cache)
                got = torch.cat([ours(StepInput.plain(ids[t : t + 1], t), cache).logits for t in range(10, 15)])
        finally:
            gemv.gemv, gemv.gemv_swiglu = orig_gemv, orig_swiglu
        try:
            ours.fuse_projections(folded_decode=False)
            refused = False
        except ValueError:
            refused = True
        result[arch] = {"err": (got - ref).abs().max().item(), "scale": ref.abs().max().item(), "add_calls": calls["add"],
                        "rows_calls": calls["rows"], "layers": len(ours.model.layers), "hidden": hidden,
                        "unfold_refused": refused}
    print(json.dumps(result))


if __name__ == "__main__":
    import sys

    {"prologue": prologue_main, "rows": rows_main, "folded_decode": folded_decode_main}.get(sys.argv[1] if sys.argv[1:] else "", main)()
