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
