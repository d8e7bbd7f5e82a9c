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


def test_exact_key_layers_are_dense_and_speculation_stays_lossless():
    """cache_k_exact_layers: the first N attention layers store K at the runtime dtype (V and the
    other layers as asked); plain and speculative decoding over that mixed cache agree."""
    from treeflash.kv.attention_cache import DenseAttentionCache
    from treeflash.kv.cache import ATTENTION
    from treeflash.kv.quantized import QuantizedAttentionCache

    _, model = make_pair("qwen3_5")  # layers: linear, full, linear, full
    cache = model.new_cache(64, "tq3_0", "q4_0", k_exact_layers=1)
    attention = [c for c, kind in zip(cache.layers, cache.layout.layer_kinds) if kind == ATTENTION]
    assert len(attention) == 2 and all(isinstance(c, QuantizedAttentionCache) for c in attention)
    assert attention[0].k.fmt.is_dense and attention[0].k.fmt.dense_dtype == model.dtype
    assert attention[1].k.fmt.name == "tq3_0" and attention[0].v.fmt.name == attention[1].v.fmt.name == "q4_0"
    dense = model.new_cache(64, "tq3_0", "bf16", k_exact_layers=2)
    assert all(isinstance(c, DenseAttentionCache) for c, kind in zip(dense.layers, dense.layout.layer_kinds) if kind == ATTENTION)
    with pytest.raises(ValueError, match="k_exact_layers"):
        model.new_cache(64, "tq3_0", "tq3_0", k_exact_layers=-1)

    prompt = torch.randint(0, 97, (12,)).tolist()

    def run_exact(drafter=None):
        dec = Decoder(model, model.new_cache(len(prompt) + 200, "tq3_0", "tq3_0", k_exact_layers=1), SamplingParams(), drafter)
        out = [dec.prefill(prompt)]
        while len(out) < 120:
            out.extend(dec.step())
        return out[:120], dec.stats

    ref, _ = run_exact()
    out, stats = run_exact(OracleDrafter(model, depth=5, width=3, corrupt=0.4))
    assert out == ref and stats.tau > 1.5
