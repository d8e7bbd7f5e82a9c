"""The static-shape runner (what CUDA graphs capture) decodes exactly like the eager runner.

On the CPU the static code runs without graph capture (use_graphs=False): same slots, key masks,
padding nodes, packed inputs and commit, so a bug there shows up here."""

import contextlib

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams


def run(model, prompt, n, drafter=None, static=False):
    cache = model.new_cache(len(prompt) + n + 40)
    runner = CudaGraphRunner(model, cache, buckets=(1, 2, 4, 8, 16), use_graphs=False) if static else None
    dec = Decoder(model, cache, SamplingParams(), drafter, runner=runner)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_static_runner_matches_eager(arch):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (10,)).tolist()
    ref = run(model, prompt, 40)
    assert run(model, prompt, 40, static=True) == ref  # plain decode through the static T=1 path
    out = run(model, prompt, 40, OracleDrafter(model, depth=4, width=2, corrupt=0.4), static=True)
    assert out == ref  # verify buckets with padding nodes, static commit


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_pipelined_greedy_decode(arch):
    """Greedy plain decoding through a graph runner enqueues step k + 1 (its token taken on the device)
    before it reads step k: same tokens as the eager runner, up to a full cache, and a sequence that
    stopped with a step enqueued ahead leaves nothing behind for the next one."""
    _, model = make_pair(arch)
    prompts = [torch.randint(0, 97, (n,)).tolist() for n in (9, 13)]
    refs = [run(model, p, 30) for p in prompts]
    cache = model.new_cache(len(prompts[0]) + 30)  # room for exactly the 30 tokens: the last step has no step ahead
    runner = CudaGraphRunner(model, cache, buckets=(1, 2, 4), use_graphs=False)
    dec = Decoder(model, cache, SamplingParams(), runner=runner)
    assert dec._pipelined()
    for prompt, ref, n in [(prompts[0], refs[0], 30), (prompts[1], refs[1], 12), (prompts[0], refs[0], 30)]:
        out = [dec.prefill(prompt)]
        while len(out) < n:
            out.extend(dec.step())
        assert out == ref[:n]
        if n == 12:
            assert dec._ahead is not None  # stopped with a step in flight: the next prefill must reset it
    assert cache.seq_len == cache.max_len
    logged = Decoder(model, cache, SamplingParams(), runner=runner, want_logprobs=0)
    assert not logged._pipelined()  # logprobs need the logits of each step: the step-by-step path
    out = [logged.prefill(prompts[1])]
    while len(out) < 20:
        out.extend(logged.step())
    assert out == refs[1][:20]


def test_capture_graph_collects_no_garbage_while_capturing(monkeypatch):
    """A dead cycle holding an earlier runner's graphs must not be freed inside a capture (it would
    destroy those graphs mid-capture and invalidate it): capture_graph turns the collector off for
    the capture only, and back on after it, also when the captured function raises."""
    import gc

    from treeflash.models import runner as runner_mod

    seen = []

    class FakeGraphCtx:
        def __init__(self, graph, pool=None):
            self.capture_stream = FakeStream()  # capture_graph warms up on the capture's own stream

        def __enter__(self):
            seen.append(("enter", gc.isenabled()))

        def __exit__(self, *exc):
            seen.append(("exit", gc.isenabled()))

    class FakeStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: FakeStream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", FakeGraphCtx)
    assert gc.isenabled()
    calls = []
    graph, out = runner_mod.capture_graph(lambda: calls.append(gc.isenabled()) or 7, pool=None, warmups=2)
    assert out == 7 and calls == [True, True, False]  # warm-ups collect as usual; the capture does not
    assert seen == [("enter", False), ("exit", False)] and gc.isenabled()

    def boom():
        if not gc.isenabled():
            raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        runner_mod.capture_graph(boom, pool=None, warmups=0)
    assert gc.isenabled()


def test_rotary_table_serves_the_computed_rows():
    """new_cache reserves a cos/sin table: forward gathers its rows (one launch in a graph) and they
    are the rows the formula computes; a limit past the table computes them."""
    from treeflash.models.transformer import ROPE_MARGIN

    _, target = make_pair("llama")
    target.new_cache(100)
    rot = target.rotary
    assert rot.table is not None and rot.table.shape[1] == 100 + ROPE_MARGIN and rot.table.dtype == target.dtype
    pos = torch.tensor([0, 7, 99, 3, 3, 64])
    cos, sin = rot.cos_sin(pos, target.dtype, limit=100)
    want_cos, want_sin = rot._compute(pos, target.dtype)
    torch.testing.assert_close(cos, want_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=1e-6, rtol=0)
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape == (6, rot.rotary_dim)
    far = torch.tensor([5000])
    torch.testing.assert_close(rot.cos_sin(far, target.dtype, limit=5001)[0], rot._compute(far, target.dtype)[0])
    target.new_cache(50)  # never shrinks
    assert rot.table.shape[1] == 100 + ROPE_MARGIN
    old = rot.table
    target.new_cache(300)  # grows; the old table stays alive for graphs captured over it
    assert rot.table.shape[1] == 300 + ROPE_MARGIN and rot._old_tables[-1] is old


def test_a_second_fuse_projections_keeps_the_folded_copies_in_place():
    """Each Engine calls fuse_projections on the (shared) model: `treeflash bench` builds the drafting
    engine, captures its graphs, then builds the plain one. The folded copies must stay where the first
    engine's graphs read them (a new tensor freed the old one under those graphs: drafts never accepted,
    outputs unlike plain decoding, NaN probabilities on the H200 in stops 23-24), and be refreshed."""
    _, target = make_pair("llama")
    target.fuse_projections(folded_rows=64)
    layers = target.model.layers
    ptrs = [(l.self_attn.qkv_folded.data_ptr(), l.mlp.gate_up_folded.data_ptr()) for l in layers]
    with torch.no_grad():
        layers[0].input_layernorm.weight.mul_(2.0)
    target.fuse_projections(folded_rows=64)
    assert [(l.self_attn.qkv_folded.data_ptr(), l.mlp.gate_up_folded.data_ptr()) for l in layers] == ptrs
    torch.testing.assert_close(layers[0].self_attn.qkv_folded, layers[0].input_layernorm.fold_into(layers[0].self_attn.qkv_weight))
    target.fuse_projections(folded_rows=0)  # the path off: the copies stay for graphs captured over them
    assert target.folded_rows == 0 and all(l.self_attn.qkv_folded is not None for l in layers)


@pytest.mark.parametrize("on_gpu,foldable,small,expected", [
    (True, True, True, True),  # the default model on CUDA: folded (stop 28: +14% decode on the H200)
    (True, True, False, False),  # a large model keeps its norm launches (the 8B shape lost 2.6%)
    (True, False, True, False),  # not foldable (q/k/v bias, hybrid): never
    (False, True, True, False),  # CPU or fp32: never
])
def test_folded_decode_default(on_gpu, foldable, small, expected):
    """The choice when the caller does not make it (fuse_projections(folded_decode=True / False) forces it)."""
    from treeflash.models.transformer import folded_decode_default

    assert folded_decode_default(on_gpu, foldable, small) is expected


def test_fuse_projections_leaves_a_cpu_model_unfolded(monkeypatch):
    """On the CPU folded decode stays off by default (the weights keep their norms' gains apart)."""
    _, target = make_pair("llama")
    attn, mlp = target.model.layers[0].self_attn, target.model.layers[0].mlp
    before = attn.q_proj.weight.clone(), mlp.gate_proj.weight.clone()
    target.fuse_projections()
    assert not target.folded_decode and not any(l.folded_in_place for l in target.model.layers)
    torch.testing.assert_close(attn.q_proj.weight, before[0], rtol=0, atol=0)  # a view of the fused weight now
    torch.testing.assert_close(mlp.gate_proj.weight, before[1], rtol=0, atol=0)
