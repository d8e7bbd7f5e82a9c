"""Speculative decoding over a compressed KV cache is lossless: chains and trees, verified and
committed in a q8_0 / q4_0 / tq3_0 cache, give the tokens plain decoding gives with the same cache
types (greedy), on an attention model and on the hybrid."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams


def run(model, prompt, n, kt, vt, drafter=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 80, kt, vt), SamplingParams(), drafter)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("kt,vt", [("q8_0", "q4_0"), ("tq3_0", "tq3_0"), ("q4_0", "bf16")])
@pytest.mark.parametrize("width", [1, 3])
def test_speculative_equals_plain_with_the_same_compressed_cache(arch, kt, vt, width):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (12,)).tolist()
    ref, _ = run(model, prompt, 120, kt, vt)
    out, stats = run(model, prompt, 120, kt, vt, OracleDrafter(model, depth=5, width=width, corrupt=0.4))
    assert out == ref
    assert stats.tau > 1.5 and all(a > 0 for a in stats.accepted_per_depth)  # deep acceptance happened
