"""A tiny hybrid model's decode steps with its projections on gemv, and its folded decode, against
cuBLAS-free plain torch / transformers. Run under TRITON_INTERPRET=1 by tests/models/test_gemv_epilogue.py;
prints one JSON line."""

from __future__ import annotations

import json

import torch

from tests.models.test_gated_deltanet import tiny_model
from treeflash.kernels.linear import gemv
from treeflash.models.step import StepInput


def decode_logits(model, ids, steps: int) -> tuple[torch.Tensor, int]:
    """Logits of `steps` decode steps after a 10-token prefill, and how many gemv calls they made."""
    calls = []
    orig = gemv.gemv

    def counted(*a, **kw):
        calls.append(1)
        return orig(*a, **kw)

    gemv.gemv = counted
    try:
        cache = model.new_cache(64)
        model(StepInput.plain(ids[:10], 0), cache)
        out = []
        for t in range(10, 10 + steps):
            out.append(model(StepInput.plain(ids[t : t + 1], t), cache).logits)
        return torch.cat(out), len(calls)
    finally:
        gemv.gemv = orig


def main() -> None:
    torch.manual_seed(0)
    model = tiny_model().fuse_projections()
    ids = torch.randint(0, 61, (16,))
    with torch.no_grad():
        ref, n_ref = decode_logits(model, ids, 5)  # no tiny shape in the tables yet: every projection on F.linear
        # the tiny shapes join the model's tables: o_proj / out_proj [32, 32], down [32, 64] (split-K 2)
        model.fuse_projections(gemv_tables=gemv.TUNED.with_entries(
            linear={(32, 32): gemv.GemvConfig(8, 32, 1, 4), (32, 64): gemv.GemvConfig(8, 16, 2, 2)},
            swiglu={(128, 32): gemv.GemvConfig(8, 16, 1, 2)}))  # gate_up [2 x 64, 32]
        plain, n_plain = decode_logits(model, ids, 5)
    print(json.dumps({"gemv_err": (plain - ref).abs().max().item(), "scale": ref.abs().max().item(),
                      "gemv_calls_ref": n_ref, "gemv_calls": n_plain}))


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
        ours.fuse_projections(folded_rows=0, folded_decode=True, gemv_tables=gemv.TUNED.with_entries(
            linear={tuple(layer.self_attn.qkv_folded.shape): gemv.GemvConfig(8, 16, 1, 2),
                    tuple(layer.self_attn.o_proj.weight.shape): gemv.GemvConfig(8, 32, 1, 4),
                    tuple(layer.mlp.down_proj.weight.shape): gemv.GemvConfig(8, 16, 2, 2)},  # split-K: the reducer adds
            swiglu={tuple(layer.mlp.gate_up_folded.shape): gemv.GemvConfig(8, 16, 1, 2)}))
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

    {"folded_decode": folded_decode_main}.get(sys.argv[1] if sys.argv[1:] else "", main)()
