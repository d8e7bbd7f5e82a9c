"""SDPA backend policy on CUDA (kv/attention_cache.py): cuDNN plans every new shape (~40 ms on the
H200), so small eager calls go without it. The choice is checked here; the timings that set the
threshold are GPU measurements (bench/results/sdpa_plan.txt)."""

import torch

from treeflash.kv import attention_cache as ac


def test_small_calls_go_without_cudnn_and_big_ones_may_take_it():
    assert not ac.sdpa_allows_cudnn(1, 100)  # a decode row
    assert not ac.sdpa_allows_cudnn(120, 136)  # a short prompt, or the drafter's pass over it
    assert not ac.sdpa_allows_cudnn(4096, 4096)  # a first 4K prefill chunk: 0.25 ms a layer saved, 40 ms to plan
    assert ac.sdpa_allows_cudnn(4096, 8192)  # ~2.7 ms a layer saved: pays for its plan within one prefill
    assert ac.sdpa_allows_cudnn(4096, 32768)


def test_backend_list_excludes_cudnn_and_keeps_a_fallback():
    assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION not in ac._NO_CUDNN
    assert torch.nn.attention.SDPBackend.MATH in ac._NO_CUDNN  # any shape and mask still runs


def test_cpu_reference_is_unchanged_by_the_policy():
    """On the CPU the 3-D math path runs as before, whatever the threshold."""
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    mask = torch.ones(5, 7, dtype=torch.bool).tril(2)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1), attn_mask=mask, scale=0.3
    ).transpose(0, 1)
    out = ac.attention_reference(q, k, v, mask, 0.3)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_graph_capture_code_keeps_cudnn():
    """What runs for a CUDA graph (warm-ups and capture) repeats one shape: cuDNN plans it once, as before."""
    assert not ac.sdpa_allows_cudnn(120, 136)
    with ac.static_shapes():
        assert ac.sdpa_allows_cudnn(120, 136)
        with ac.static_shapes():
            assert ac.sdpa_allows_cudnn(1, 1)
        assert ac.sdpa_allows_cudnn(1, 1)
    assert not ac.sdpa_allows_cudnn(120, 136)


def test_capture_graph_runs_in_static_shapes(monkeypatch):
    from treeflash.models import runner

    seen = []
    monkeypatch.setattr(runner, "_capture", lambda fn, pool, warmups: seen.append(ac._static_depth) or ("graph", None))
    assert runner.capture_graph(lambda: None, None) == ("graph", None)
    assert seen == [1] and ac._static_depth == 0
