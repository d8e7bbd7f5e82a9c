"""A prefill chunk over a compressed cache reads one KV head at a time (QuantizedAttentionCache._prefill_attention):
the same attention as dequantizing every head's rows at once and repeating them per query head."""

import pytest
import torch

from treeflash.kv.attention_cache import new_token_attention
from treeflash.kv.quantized import QuantizedAttentionCache
from treeflash.kv.spec import CacheSpec


@pytest.mark.parametrize("k_type,v_type", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("tq3_0", "tq3_0"), ("q4_0", "bf16")])
def test_per_head_prefill_equals_the_whole_read(k_type, v_type):
    g = torch.Generator().manual_seed(0)
    h, hkv, d, first, n = 6, 2, 64, 150, 140
    cache = QuantizedAttentionCache(hkv, d, CacheSpec(512, torch.float32, torch.device("cpu"), k_type, v_type))
    for start, t in ((0, first), (first, n)):  # two prefill chunks: the second reads the first's rows too
        q, k, v = (torch.randn(t, heads, d, generator=g) for heads in (h, hkv, hkv))
        out = cache.attend(q, k, v, start, None, d**-0.5)
    keys, values = cache.k.read(first + n, torch.float32), cache.v.read(first + n, torch.float32)
    want = new_token_attention(cache._reference_query(q), keys, values, first, None, d**-0.5)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_read_head_equals_read():
    g = torch.Generator().manual_seed(1)
    cache = QuantizedAttentionCache(3, 32, CacheSpec(64, torch.bfloat16, torch.device("cpu"), "q4_0", "q8_0"))
    cache.attend(*(torch.randn(40, heads, 32, generator=g) for heads in (3, 3, 3)), 0, None, 32**-0.5)
    for rows in (cache.k, cache.v):
        whole = rows.read(40, torch.bfloat16)
        assert all(torch.equal(rows.read_head(40, i, 32, torch.bfloat16), whole[:, i : i + 1]) for i in range(3))
        # several row chunks per head (DEQUANT_ROWS is 16,384 in use)
        assert all(torch.equal(rows.read_head(40, i, 32, torch.bfloat16, chunk=7), whole[:, i : i + 1]) for i in range(3))
