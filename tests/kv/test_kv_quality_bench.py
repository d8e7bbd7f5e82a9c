"""bench/kv_quality.py on a tiny random model: the metrics exist, are sane, and order the formats."""

import importlib.util
from pathlib import Path

import torch

from tests.models.hf_oracle import make_pair

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kv_quality.py"


def _load():
    spec = importlib.util.spec_from_file_location("kv_quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kv_quality_measure_on_tiny_model():
    bench = _load()
    _, model = make_pair("qwen3")
    ids = torch.randint(0, 97, (48,))
    m = bench.measure(model, ids, ["f32/f32", "q8_0/q8_0", "tq3_0/tq3_0"], chunk=16)
    assert m["f32/f32"]["kl_mean"] < 1e-9 and m["f32/f32"]["top1_agreement"] == 1.0  # same as dense
    assert m["f32/f32"]["perplexity_delta"] == 0
    assert 0 < m["q8_0/q8_0"]["kl_mean"] < m["tq3_0/tq3_0"]["kl_mean"]
    for pair in ("q8_0/q8_0", "tq3_0/tq3_0"):
        r = m[pair]
        assert r["kl_mean"] <= r["kl_p99"] <= r["kl_max"] + 1e-12
        assert abs(r["perplexity"] - m["dense"]["perplexity"]) == abs(r["perplexity_delta"])


def test_default_text_is_long():
    assert len(_load().default_text(20000)) == 20000


def test_fast_attention_matches_reference():
    from treeflash.kv.attention_cache import attention_reference, build_mask

    bench = _load()
    torch.manual_seed(0)
    for t, start in ((7, 0), (5, 11), (1, 16)):  # prefill, a later chunk (mask over a prefix), decode (mask None)
        q = torch.randn(t, 6, 32)
        k, v = torch.randn(start + t, 2, 32), torch.randn(start + t, 2, 32)
        mask = build_mask(t, start, None, q.device)
        ref = attention_reference(q, k, v, mask, 0.2)
        assert torch.allclose(bench.fast_attention(q, k, v, mask, 0.2), ref, atol=1e-6, rtol=1e-5)
        if t > 1:  # what a dense cache's prefill chunk passes now
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(t, start + t)
            assert torch.allclose(bench.fast_attention(q, k, v, bias, 0.2), ref, atol=1e-6, rtol=1e-5)


def test_no_rotation_variant_and_pairs():
    from treeflash.kernels.kv import kv_formats as formats

    bench = _load()
    assert len(bench.GRID) == 16 and bench._split_pair("tq3_0-norot/bf16") == ("tq3_0", "bf16", True)
    x = torch.randn(4, 2, 64)
    rotate = formats.rotate
    with bench._no_rotation():
        assert torch.equal(formats.rotate(x), x)
        s, c = formats.quantize("tq3_0", x)
        plain = formats.dequantize("tq3_0", s, c)
    assert formats.rotate is rotate  # restored
    s, c = formats.quantize("tq3_0", x)
    rotated = formats.dequantize("tq3_0", s, c)
    assert not torch.equal(plain, rotated)
    # both keep each row's norm (per-block scales) and are close to x
    assert torch.allclose(plain.norm(dim=-1), x.norm(dim=-1), rtol=1e-2)
    assert ((rotated - x).norm() / x.norm()) < 0.3


def test_build_prompt_places_needle():
    bench = _load()

    class Tok:  # one token per character
        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(ch) for ch in s]}

        def decode(self, ids):
            return "".join(map(chr, ids))

    text = "".join(f"line {i}\n" for i in range(200))
    ids, info = bench.build_prompt(Tok(), text, 1000, 0.25)
    s = "".join(map(chr, ids))
    assert s.endswith(bench.QUESTION) and info["passphrase"] in s
    assert info["text_tokens"] == len(ids) - len(bench.QUESTION)
    assert 240 <= info["needle_token"] <= 270 and s[info["needle_token"] :].startswith("# The secret passphrase is")


def test_row_errors_on_tiny_model():
    bench = _load()
    _, model = make_pair("qwen3")
    r = bench.row_errors(model, torch.randint(0, 97, (24,)), chunk=8)
    for name in ("k", "v"):
        e = {f: r[name][f]["rel_rms"] for f in ("bf16", "q8_0", "q4_0", "tq3_0", bench.NOROT)}
        assert r[name]["rows"] > 0 and 0 < e["bf16"] < e["q8_0"] < e["q4_0"] < e["tq3_0"] < 0.5, e
