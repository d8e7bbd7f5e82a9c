"""The flash-linear-attention prefill path (kernels/gdn/gdn_chunk.py): its dispatch, and how the model
hands it q, k, v, gates and state. fla itself only runs on CUDA (bench/gpu_fla.py checks it on the
H200 against the reference); here a stand-in with fla's documented contract replaces it:
[B, T, H, K] inputs, grouped-value heads (v head h reads k head h // (Hv / Hk)), q/k l2-normed in
the kernel, `scale` applied to q, state [N, Hv, K, V], returns (o [B, T, Hv, V], final state)."""

import torch

from tests.models.test_gated_deltanet import tiny_model
from treeflash.kernels.gdn import gdn_chunk
from treeflash.models.gated_deltanet import delta_rule_chunked, l2norm
from treeflash.models.step import StepInput


def fake_fla(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    assert q.dim() == 4 and q.shape[0] == 1 and use_qk_l2norm_in_kernel and output_final_state
    group = v.shape[2] // q.shape[2]
    qn = (l2norm(q[0].float()) * scale).repeat_interleave(group, dim=1)
    kn = l2norm(k[0].float()).repeat_interleave(group, dim=1)
    o, s = delta_rule_chunked(qn, kn, v[0].float(), g[0], beta[0], initial_state[0], chunk_size=16)
    return o[None], s[None]


def test_dispatch_off_cuda_and_when_disabled(monkeypatch):
    x = torch.zeros(3, 4)
    assert not gdn_chunk.available(x)  # CPU tensors always take the reference
    monkeypatch.setattr(gdn_chunk, "_fla_chunk", lambda: None)
    assert not gdn_chunk.available(x)
    try:
        gdn_chunk.chunk_gated_delta(*(torch.zeros(1),) * 6, torch.float32)
    except RuntimeError as e:
        assert "flash-linear-attention" in str(e)
    else:
        raise AssertionError("expected a RuntimeError without fla")


def test_model_prefill_through_the_fla_contract_equals_the_reference(monkeypatch):
    model = tiny_model()
    ids = torch.randint(0, 61, (45,))
    with torch.no_grad():
        ref_cache = model.new_cache(64)
        ref = model(StepInput.plain(ids, 0), ref_cache).logits
        calls = []
        monkeypatch.setattr(gdn_chunk, "available", lambda x: True)
        monkeypatch.setattr(gdn_chunk, "_fla_chunk", lambda: lambda *a, **kw: calls.append(1) or fake_fla(*a, **kw))
        cache = model.new_cache(64)
        out = model(StepInput.plain(ids, 0), cache).logits
        nxt = model(StepInput.plain(ids[:1], 45), cache).logits  # decode continues from fla's state
        ref_nxt = model(StepInput.plain(ids[:1], 45), ref_cache).logits
    assert len(calls) == 2  # both linear-attention layers
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, ref_nxt, atol=1e-5, rtol=1e-5)


def test_a_failing_fla_falls_back_to_the_reference_with_a_warning(monkeypatch):
    import pytest

    model = tiny_model()
    ids = torch.randint(0, 61, (30,))

    tries = []

    def broken(*a, **kw):
        tries.append(1)
        raise RuntimeError("triton mismatch")

    with torch.no_grad():
        ref = model(StepInput.plain(ids, 0), model.new_cache(64)).logits
        monkeypatch.setattr(gdn_chunk, "_fla_chunk", lambda: broken)
        monkeypatch.setattr(gdn_chunk, "available", lambda x: True)
        with pytest.warns(RuntimeWarning, match="falls back"):
            out = model(StepInput.plain(ids, 0), model.new_cache(64)).logits
        layers = [l.linear_attn for l in model.model.layers if hasattr(l, "linear_attn")]
        assert layers and not any(l.use_fla for l in layers) and len(tries) == len(layers)
        model(StepInput.plain(ids, 0), model.new_cache(64))
    assert len(tries) == len(layers)  # once failed, not tried again
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
