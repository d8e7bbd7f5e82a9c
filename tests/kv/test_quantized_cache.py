"""QuantizedAttentionCache (CPU reference path): every step equals attention over the dequantized
rows; tree verify hides non-ancestors; commit compacts any accepted path; a model decoding with
a q8_0 cache stays close to the dense cache."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from treeflash.kernels.kv import kv_formats as formats
from treeflash.kv.cache import make_attention_cache
from treeflash.kv.cache import CacheSpec
from treeflash.kernels.kv.kv_formats import bytes_per_token_per_layer
from treeflash.kv.quantized import QuantizedAttentionCache
from treeflash.models.step import StepInput

HKV, H, D = 2, 4, 64
PAIRS = [("q8_0", "q8_0"), ("q4_0", "tq3_0"), ("tq3_0", "bf16"), ("f32", "q4_0"), ("tq3_0", "tq3_0")]


def _cache(kt, vt, max_len=32, head_dim=D, dtype=torch.float32):
    return make_attention_cache(HKV, head_dim, CacheSpec(max_len, dtype, torch.device("cpu"), kt, vt))


def _stored(name, rows):
    """What the cache holds for `rows` [S, Hkv, D], dequantized."""
    s, c = formats.quantize(name, rows)
    return formats.dequantize(name, s, c)


def _stored_keys(cache, name, rows):
    """What a cache's K rows hold for `rows` (already centered), dequantized, in the original domain:
    q8_0 / q4_0 keys under rotate_keys are quantized rotated and read back with the rotation undone."""
    if getattr(cache, "rotate_keys", False):
        return formats.unrotate(_stored(name, formats.rotate(rows)))
    return _stored(name, rows)


def _expected(q, keys, values, visible, scale):
    """Plain softmax attention, GQA by repeating KV heads. q [T, H, D], keys [S, Hkv, D], visible [T, S]."""
    rep = q.shape[1] // keys.shape[1]
    k, v = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def _tree(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


@pytest.mark.parametrize("kt,vt", PAIRS)
def test_prefill_verify_commit_decode_equal_dequantized_reference(kt, vt):
    cache = _cache(kt, vt)
    assert isinstance(cache, QuantizedAttentionCache)
    scale = D**-0.5
    ks, vs = torch.randn(0, HKV, D), torch.randn(0, HKV, D)  # committed raw rows

    def step(num_new, start, tree_mask):
        nonlocal ks, vs
        q, k, v = torch.randn(num_new, H, D), torch.randn(num_new, HKV, D), torch.randn(num_new, HKV, D)
        out = cache.attend(q, k, v, start, tree_mask, scale)
        m = cache.key_offset if cache.key_offset is not None else 0.0  # compressed keys: stored minus the prompt's mean
        new_vis = torch.ones(num_new, num_new, dtype=torch.bool).tril() if tree_mask is None else tree_mask
        visible = torch.cat((torch.ones(num_new, start, dtype=torch.bool), new_vis), 1)
        all_k, all_v = torch.cat((ks, k)), torch.cat((vs, v))
        want = _expected(q, _stored_keys(cache, kt, all_k - m), _stored(vt, all_v), visible, scale)
        assert (out - want).abs().max().item() < 1e-5
        return k, v

    k, v = step(6, 0, None)  # prefill
    ks, vs = k, v
    k, v = step(1, 6, None)  # decode
    ks, vs = torch.cat((ks, k)), torch.cat((vs, v))
    parents = [-1, 0, 0, 1, 2, 4]
    k, v = step(6, 7, _tree(parents))  # verify
    path = [0, 2, 4, 5]  # non-contiguous
    cache.commit(7, path)
    ks, vs = torch.cat((ks, k[path])), torch.cat((vs, v[path]))
    if not cache.k.fmt.is_dense:  # the committed slots hold exactly the path nodes' quantized rows
        rows = k[path] - cache.key_offset
        s, c = formats.quantize(kt, formats.rotate(rows) if cache.rotate_keys else rows)
        assert torch.equal(cache.k.scales[7:11], s) and torch.equal(cache.k.codes[7:11], c)
    k, v = step(1, 11, None)  # decode after the commit sees prefix + path
    ks, vs = torch.cat((ks, k)), torch.cat((vs, v))
    step(3, 12, None)  # a 3-token causal step (chunked prefill)


@pytest.mark.parametrize("kt", ["q8_0", "q4_0", "tq3_0"])
def test_key_offset_is_the_prompts_mean_key_and_attention_ignores_it(kt):
    """Keys share a large mean (as Qwen2.5's do): the offset is the prompt's mean key, fixed for the
    sequence; attention equals attention over the uncentered dequantized keys shifted by it (a
    shift every score of a query shares), and centering cuts the error against exact attention."""
    torch.manual_seed(1)
    mean = 8 * torch.randn(HKV, D)
    keys = mean + torch.randn(12, HKV, D)
    q, v = torch.randn(12, H, D), torch.randn(12, HKV, D)
    exact = _expected(q, keys, v, torch.ones(12, 12, dtype=torch.bool).tril(), D**-0.5)
    outs = {}
    for center in (True, False):
        cache = make_attention_cache(HKV, D, CacheSpec(32, torch.float32, torch.device("cpu"), kt, "f32", center))
        out = cache.attend(q[:8], keys[:8], v[:8], 0, None, D**-0.5)
        out2 = cache.attend(q[8:], keys[8:], v[8:], 8, None, D**-0.5)
        if center:
            torch.testing.assert_close(cache.key_offset, keys[:8].mean(0))
            cache.reset()
            assert not cache.key_offset.any()
        else:
            assert cache.key_offset is None
        outs[center] = torch.cat((out, out2))
    err_centered, err_plain = ((outs[c] - exact).abs().max().item() for c in (True, False))
    assert err_centered < 0.5 * err_plain


@pytest.mark.parametrize("kt", ["q8_0", "q4_0"])
def test_rotated_keys_cut_the_error_on_outlier_keys(kt):
    """q8_0 / q4_0 keys stored rotated (CacheSpec.rotate_keys, the default): attention is exact in the
    rotation (the query turns with the keys), and on keys with a large channel, which sets its block's
    scale, the error against exact attention drops."""
    torch.manual_seed(2)
    keys = torch.randn(12, HKV, D)
    keys[..., 7] *= 12.0
    q, v = torch.randn(12, H, D), torch.randn(12, HKV, D)
    exact = _expected(q, keys, v, torch.ones(12, 12, dtype=torch.bool).tril(), D**-0.5)
    err = {}
    for rotate in (True, False):
        spec = CacheSpec(32, torch.float32, torch.device("cpu"), kt, "f32", rotate_keys=rotate)
        cache = make_attention_cache(HKV, D, spec)
        assert cache.rotate_keys is rotate
        out = torch.cat((cache.attend(q[:8], keys[:8], v[:8], 0, None, D**-0.5),
                         cache.attend(q[8:], keys[8:], v[8:], 8, None, D**-0.5)))
        err[rotate] = (out - exact).abs().max().item()
    assert err[True] < 0.7 * err[False]


def test_only_q8_0_and_q4_0_keys_are_rotated_by_the_cache():
    """tq3_0 rotates inside its own format; dense keys and values are never touched."""
    assert _cache("q8_0", "q8_0").rotate_keys and _cache("q4_0", "bf16").rotate_keys
    assert not any(_cache(kt, vt).rotate_keys for kt, vt in (("tq3_0", "q8_0"), ("bf16", "q4_0"), ("f32", "q8_0")))


def test_dense_keys_are_not_centered():
    assert _cache("bf16", "q8_0").key_offset is None


@pytest.mark.parametrize("kt,vt", [("q8_0", "q4_0"), ("tq3_0", "tq3_0")])
def test_tree_node_sees_only_its_ancestors(kt, vt):
    """Node 4 of the tree (root 0 -> 2 -> 4) gets what a causal step over [0, 2, 4] gets."""
    prefix_k, prefix_v, prefix_q = torch.randn(5, HKV, D), torch.randn(5, HKV, D), torch.randn(5, H, D)
    q, k, v = torch.randn(6, H, D), torch.randn(6, HKV, D), torch.randn(6, HKV, D)
    tree_cache, chain_cache = _cache(kt, vt), _cache(kt, vt)
    for c in (tree_cache, chain_cache):
        c.attend(prefix_q, prefix_k, prefix_v, 0, None, 0.1)
    tree_out = tree_cache.attend(q, k, v, 5, _tree([-1, 0, 0, 1, 2, 2]), 0.1)
    chain = [0, 2, 4]
    chain_out = chain_cache.attend(q[chain], k[chain], v[chain], 5, None, 0.1)
    assert torch.allclose(tree_out[chain], chain_out, atol=1e-6)
    chain_cache.commit(5, [0, 1, 2])  # contiguous path: a no-op
    tree_cache.commit(5, chain)
    for t in (tree_cache.k.codes, tree_cache.v.codes):
        assert t is not None
    assert torch.equal(tree_cache.k.codes[:8], chain_cache.k.codes[:8])
    assert torch.equal(tree_cache.v.codes[:8], chain_cache.v.codes[:8])


@pytest.mark.parametrize("kt,vt", PAIRS)
def test_nbytes_matches_the_byte_accounting(kt, vt):
    cache = _cache(kt, vt, max_len=40)
    assert cache.nbytes() == 40 * bytes_per_token_per_layer(kt, HKV, D, cache_type_v=vt)


def test_bad_cache_type_or_head_dim():
    with pytest.raises(ValueError, match="valid types"):
        _cache("q8_0", "q3_k")
    with pytest.raises(ValueError, match="head_dim"):
        _cache("q4_0", "bf16", head_dim=48)


def _decode(model, ids, prefill, cache):
    parts = [model(StepInput.plain(ids[:prefill], 0), cache).logits]
    for t in range(prefill, ids.shape[0]):
        parts.append(model(StepInput.plain(ids[t : t + 1], t), cache).logits)
    return torch.cat(parts)


def _kl(ref_logits, logits):
    p = ref_logits.log_softmax(-1)
    return (p.exp() * (p - logits.log_softmax(-1))).sum(-1)


@torch.inference_mode()
def test_model_decoding_with_q8_0_cache_is_close_to_dense():
    _, model = make_pair("qwen3")  # head_dim 32, 2 KV heads, 3 layers
    ids = torch.randint(0, 97, (40,))
    dense = _decode(model, ids, 24, model.new_cache(64))
    q8 = _decode(model, ids, 24, model.new_cache(64, cache_type_k="q8_0", cache_type_v="q8_0"))
    q4 = _decode(model, ids, 24, model.new_cache(64, cache_type_k="q4_0", cache_type_v="tq3_0"))
    kl8, kl4 = _kl(dense, q8), _kl(dense, q4)
    # measured: q8_0 max |dlogit| 5.7e-3 (logits up to 0.87), max KL ~1e-6; q4_0/tq3_0 ~30x worse
    assert (q8 - dense).abs().max().item() < 0.02
    assert kl8.max().item() < 1e-4
    assert kl8.mean() < kl4.mean()


@torch.inference_mode()
@pytest.mark.parametrize("kt,vt", [("q8_0", "q8_0"), ("tq3_0", "q4_0")])
def test_model_verify_then_commit_equals_plain_decoding(kt, vt):
    """Tree verify + commit(path) with a quantized cache leaves the cache as plain decoding of the path."""
    _, model = make_pair("qwen3")
    ids = torch.randint(0, 97, (12,))
    nodes = torch.randint(0, 97, (5,))
    parents, path = [-1, 0, 0, 2, 1], [0, 2, 3]
    tree_cache = model.new_cache(32, cache_type_k=kt, cache_type_v=vt)
    model(StepInput.plain(ids, 0), tree_cache)
    verify = model(StepInput.tree(nodes, parents, 12), tree_cache).logits
    tree_cache.commit(path)
    plain_cache = model.new_cache(32, cache_type_k=kt, cache_type_v=vt)
    model(StepInput.plain(ids, 0), plain_cache)
    plain = model(StepInput.plain(nodes[path], 12), plain_cache).logits
    # float noise between batch shapes can flip a rounding: compare with a tolerance
    assert (verify[path] - plain).abs().max().item() < 2e-3
    nxt = torch.tensor([5])
    a = model(StepInput.plain(nxt, 15), tree_cache).logits
    b = model(StepInput.plain(nxt, 15), plain_cache).logits
    assert (a - b).abs().max().item() < 2e-3


@torch.inference_mode()
def test_bf16_model_with_quantized_cache_runs():
    _, model = make_pair("qwen3", dtype=torch.bfloat16)
    ids = torch.randint(0, 97, (10,))
    logits = _decode(model, ids, 6, model.new_cache(16, cache_type_k="tq3_0", cache_type_v="q8_0"))
    assert logits.shape == (10, 97) and torch.isfinite(logits).all()


@pytest.mark.parametrize("kt,vt", [("q8_0", "tq3_0"), ("q4_0", "f32")])
def test_static_mode_equals_dynamic_mode(kt, vt):
    """attend_static (slots + [T, max_len] key mask) and commit_static give what attend/commit give."""
    max_len = 24
    dyn, sta = _cache(kt, vt, max_len), _cache(kt, vt, max_len)

    def both(num_new, start, tree_mask, static=True):
        q, k, v = torch.randn(num_new, H, D), torch.randn(num_new, HKV, D), torch.randn(num_new, HKV, D)
        new = torch.ones(num_new, num_new, dtype=torch.bool).tril() if tree_mask is None else tree_mask
        key_mask = torch.zeros(num_new, max_len, dtype=torch.bool)
        key_mask[:, :start] = True
        key_mask[:, start : start + num_new] = new
        a = dyn.attend(q, k, v, start, tree_mask, 0.125)
        if static:
            b = sta.attend_static(q, k, v, torch.arange(start, start + num_new), key_mask, 0.125)
        else:
            b = sta.attend(q, k, v, start, tree_mask, 0.125)
        assert (a - b).abs().max().item() < 1e-5

    both(5, 0, None, static=False)  # the prefill runs eagerly (and fixes the key offset), as in the runner
    both(2, 5, None)  # a static decode-like step
    dyn.commit(5, [0, 1])
    both(5, 7, _tree([-1, 0, 1, 0, 3]))
    path = [0, 3, 4]
    dyn.commit(7, path)
    sta.commit_static(torch.arange(7, 10), torch.tensor(path) + 7)
    both(1, 10, None)
    for a, b in ((dyn.k, sta.k), (dyn.v, sta.v)):
        assert torch.equal(a.codes[:11], b.codes[:11])
