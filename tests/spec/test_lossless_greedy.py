"""Speculative greedy output is token-identical to plain greedy output, for every architecture."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from treeflash.spec.decoder import Decoder
from treeflash.spec.ngram import NgramDrafter
from treeflash.spec.sampling import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "qwen3_5"]


def run(model, prompt, n, drafter=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 80), SamplingParams(), drafter)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("width", [1, 3])
def test_oracle_drafter_is_lossless(arch, width):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (12,)).tolist()
    ref, _ = run(model, prompt, 200)
    out, stats = run(model, prompt, 200, OracleDrafter(model, depth=5, width=width, corrupt=0.4))
    assert out == ref
    acc = stats.accepted_per_depth
    assert stats.tau > 1.5 and len(acc) == 5 and all(a > 0 for a in acc)  # deep acceptance happened
    assert stats.passes > stats.accepted_per_depth[0]  # and rejection at the root too


@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_is_lossless(arch):
    _, model = make_pair(arch)
    prompt = (torch.randint(0, 97, (8,)).tolist()) * 3
    ref, _ = run(model, prompt, 200)
    out, _ = run(model, prompt, 200, NgramDrafter(num_draft=4))
    assert out == ref
