"""Our model code equals transformers' (the oracle) on random tiny configs, fp32."""

import pytest
import torch

from treeflash.models.step import StepInput
from tests.models.hf_oracle import make_pair

ARCHS = ["llama", "qwen2", "qwen3", "qwen3_5"]


@pytest.mark.parametrize("fused", [False, True, "folded"])
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_prefill_logits_match_transformers(arch, fused):
    """fused: one GEMV for q/k/v and gate/up; "folded": also each norm's scale folded into the projection's weights and its 1 / rms applied
    after it, the residual adds in the GEMMs (forward_folded; qwen2's q/k/v bias and qwen3_5's
    gated, hybrid layers refuse it)."""
    hf, ours = make_pair(arch)
    if fused == "folded" and not ours.fuse_projections(folded_rows=0).foldable():
        with pytest.raises(ValueError, match="folded norms"):
            ours.fuse_projections(folded_rows=64)
        return
    if fused:
        ours.fuse_projections(folded_rows=64 if fused == "folded" else 0)
    ids = torch.randint(0, 97, (1, 23))
    ref = hf(ids).logits[0].float()
    cache = ours.new_cache(64)
    out = ours(StepInput.plain(ids[0], 0), cache).logits
    err = (out - ref).abs().max().item()
    print(f"{arch} fused={fused}: prefill logits max abs difference {err:.2e}")  # docs/core.md quotes these (pytest -s)
    assert err < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_incremental_decode_equals_full_forward(arch):
    """The prefill (30 and 11 tokens), then one token at a time: the same logits as one pass."""
    _, ours = make_pair(arch)
    ours.fuse_projections()
    ids = torch.randint(0, 97, (30,))
    full = ours(StepInput.plain(ids, 0), ours.new_cache(64)).logits
    cache = ours.new_cache(64)
    parts = [ours(StepInput.plain(ids[:11], 0), cache).logits]  # prefill, then one token at a time
    for t in range(11, 30):
        parts.append(ours(StepInput.plain(ids[t : t + 1], t), cache).logits)
    step = torch.cat(parts)
    assert (step - full).abs().max().item() < 1e-4
