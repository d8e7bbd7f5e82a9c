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
    assert ac.sdpa_allows_cudnn(120, 136, static=True)
    assert ac.sdpa_allows_cudnn(1, 1, static=True)
    assert not ac.sdpa_allows_cudnn(120, 136)  # no state left behind


def test_static_steps_call_sdpa_as_static(monkeypatch):
    """The static-shape (graph) paths that reach SDPA say so: the static fallback of a draft model's
    attention and a quantized cache's attend_static; the eager path does not."""
    seen = []
    real = ac.sdpa_allows_cudnn
    monkeypatch.setattr(ac, "_fused_sdpa", lambda q: True)  # as on CUDA: the policy is consulted
    monkeypatch.setattr(ac, "sdpa_allows_cudnn", lambda n, s, static=False: seen.append(static) or real(n, s, static))
    q, k, v = torch.randn(3, 4, 8), torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    mask = torch.ones(3, 6, dtype=torch.bool)
    ac.static_attention_reference(q, k, v, mask, 0.3)
    ac.attention_reference(q, k, v, mask, 0.3)
    assert seen == [True, False]
