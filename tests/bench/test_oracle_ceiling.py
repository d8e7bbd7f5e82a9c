"""bench.oracle_ceiling on a tiny random model (CPU): the replay oracle commits tau - 1 drafted tokens a step
and its output is plain decoding's, with the held token's bias and through a random GGUF kept in its blocks."""

import argparse

import pytest

from bench import oracle_ceiling


def _args(tmp_path, **kw):
    base = dict(taus=[4], tokens=24, prompt_len=8, gguf_dir=str(tmp_path), held_token=3, held_bias=1e4)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-dense:q4_k_m"])
def test_replay_reaches_the_asked_tau(tmp_path, shape):
    res = oracle_ceiling.bench_shape(shape, _args(tmp_path))
    (row,) = res["oracle"]
    assert res["held_token"] == 3
    assert row["same_as_plain"]
    # 24 tokens after the first: steps of 4 commits, so every replayed step was accepted whole
    assert row["tau"] == pytest.approx(4.0, abs=0.5)


def test_held_head_makes_the_token_greedy(tmp_path):
    from bench.gpu_shapes import build_model
    import torch

    model = build_model("tiny-dense")
    oracle_ceiling.hold_head(model, 7, 1e4)
    logits = model.head(torch.randn(5, model.config.hidden_size, dtype=model.dtype))
    assert logits.argmax(-1).tolist() == [7] * 5
