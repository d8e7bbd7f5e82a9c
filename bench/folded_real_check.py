"""Folded norms (CausalLM.forward_folded) against the unfolded layers on the real default model in
bf16, each against fp32: the relative max logit error and the argmax agreement of verify trees of
33 and 65 random-token nodes after a chat prompt. On the CPU the kernels' torch references run (the
same math as the GPU kernels); written in stop 23 to check that folding the norm's scale into the
weights and applying 1 / rms after the GEMM does not lose precision on SmolLM2's real activations.

    python bench/folded_real_check.py --out folded_real_check.json
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch


@torch.inference_mode()
def main() -> None:
    from treeflash.models.loader import load_model
    from treeflash.models.step import StepInput

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="the target (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--nodes", default="33,65")
    p.add_argument("--out", default="folded_real_check.json")
    args = p.parse_args()
    loaded = load_model(args.model, device="cpu", dtype=torch.bfloat16, progress=False)
    model = loaded.model.fuse_projections(folded_rows=128)
    ref = copy.deepcopy(model).float().fuse_projections(folded_rows=0)
    prompt = loaded.tokenizer("<|im_start|>user\nWrite a Python function that checks whether a number is prime."
                              "<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    ids = torch.tensor(prompt)

    def verify(m, folded: int, n: int) -> torch.Tensor:
        cache = m.new_cache(len(prompt) + n + 8)
        m.folded_rows = 0
        m(StepInput.plain(ids, 0), cache)  # the same (unfolded) prefill for every variant
        m.folded_rows = folded
        tree = torch.randint(0, m.config.vocab_size, (n,), generator=torch.Generator().manual_seed(n))
        parents = [-1] + [max(0, i - 1 - (i % 3 == 0)) for i in range(1, n)]
        return m(StepInput.tree(tree, parents, len(prompt)), cache).logits.float()

    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        r = verify(ref, 0, n)
        scale = r.abs().max()
        row = {"nodes": n}
        for name, folded in (("unfolded", 0), ("folded", 128)):
            b = verify(model, folded, n)
            row[name] = {"finite": bool(torch.isfinite(b).all()), "rel_err_vs_fp32": round(float((b - r).abs().max() / scale), 5),
                         "argmax_agree_fp32": round(float((b.argmax(-1) == r.argmax(-1)).float().mean()), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"model": loaded.source, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
