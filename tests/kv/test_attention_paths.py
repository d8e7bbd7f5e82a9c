"""How the caches call SDPA for new tokens: 4-D inputs (its fused kernels take no others; 3-D ones
ran its math path on the GPU), a prefill chunk through the lower-right causal bias, and the same
numbers as an explicit visibility mask."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from treeflash.kv.attention_cache import DenseAttentionCache, build_mask
from treeflash.kv.cache import make_attention_cache
from treeflash.kv.cache import CacheSpec


def _explicit(q, keys, values, start, tree_mask, scale):
    """fp64 softmax attention under build_mask: q [T, H, D], keys/values [S, Hkv, D]."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, 1)
    v = values.double().repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->hts", q.double(), k) * scale
    mask = build_mask(q.shape[0], start, tree_mask, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cache_type", ["auto", "q8_0"])
@pytest.mark.parametrize("tree", [False, True])
def test_new_tokens_go_to_sdpa_in_4d_and_match_an_explicit_mask(monkeypatch, cache_type, tree, fused):
    """fused (what CUDA gets): 4-D inputs; else (the CPU) 3-D, SDPA's batch-invariant math path."""
    torch.manual_seed(0)
    hkv, h, d, start, n = 2, 6, 32, 9, 5
    spec = CacheSpec(max_len=64, dtype=torch.float32, device=torch.device("cpu"), cache_type_k=cache_type, cache_type_v=cache_type)
    cache = make_attention_cache(hkv, d, spec)
    assert isinstance(cache, DenseAttentionCache) == (cache_type == "auto")
    ranks = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        ranks.append((q.dim(), k.dim(), v.dim()))
        return real(q, k, v, **kw)

    from treeflash.kv import attention_cache  # its module's F only: the causal bias must still see the real function

    monkeypatch.setattr(attention_cache, "F", SimpleNamespace(scaled_dot_product_attention=spy))
    monkeypatch.setattr(attention_cache, "_fused_sdpa", lambda q: fused)
    k0, v0 = torch.randn(start, hkv, d), torch.randn(start, hkv, d)
    cache.attend(torch.randn(start, h, d), k0, v0, 0, None, d**-0.5)  # the prompt: a prefill chunk
    q, k, v = torch.randn(n, h, d), torch.randn(n, hkv, d), torch.randn(n, hkv, d)
    tree_mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], dtype=torch.bool) if tree else None
    got = cache.attend(q, k, v, start, tree_mask, d**-0.5)
    rank = 4 if fused else 3
    assert ranks and all(r == (rank, rank, rank) for r in ranks)
    if cache_type == "auto":  # exact cache: the reference is the stored keys themselves
        keys, values = torch.cat((k0, k)), torch.cat((v0, v))
        torch.testing.assert_close(got.double(), _explicit(q, keys, values, start, tree_mask, d**-0.5), atol=1e-5, rtol=1e-5)
