"""The DFlash drafter's static passes (DraftGraphs: CUDA graphs on a GPU, the same static code run
eagerly here) propose exactly the trees of the eager pass, step by step, beside the static-shape
target runner; decoding stays token-identical to plain decoding."""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.test_dflash_model import random_drafter
from tests.spec.test_lossless_greedy import run
from treeflash.models.runner import CudaGraphRunner
from treeflash.models.step import StepInput
from treeflash.spec.decoder import Decoder
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.sampling import SamplingParams

NUM_TOKENS = 120


# These tests check what `propose` returns: their decoders take device_steps=False, since greedy
# fixed-budget steps would otherwise run on the device past it (tests/spec/test_device_step.py covers those).


class Recorder(DFlashDrafter):
    """Keeps every proposed tree (ids, parents) and whether the pass was static."""

    def propose(self, ctx):
        static_before = self.graphs is not None and self.graphs.fits(sum(r.shape[0] for r in self._pending))
        tree = super().propose(ctx)
        self.trees = getattr(self, "trees", []) + [(tree.token_ids.tolist(), list(tree.parents), static_before)]
        return tree


def decode(target, model, prompt, budget, tree, static: bool, params=None):
    cache = target.new_cache(len(prompt) + NUM_TOKENS + 80)
    drafter = Recorder(target, model, budget=budget, tree=tree)
    runner = None
    if static:
        runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
        drafter.bind_runner(runner)
        assert drafter.graphs is not None and sorted(drafter.graphs.passes) == list(range(1, model.config.block_size + 1))
    dec = Decoder(target, cache, params or SamplingParams(), drafter, runner=runner, device_steps=False)
    out = [dec.prefill(prompt)]
    while len(out) < NUM_TOKENS:
        out.extend(dec.step())
    return out[:NUM_TOKENS], drafter.trees


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("budget", ["chain", 6, 22])
def test_static_passes_propose_the_eager_trees(arch, budget):
    if arch == "qwen3_5":
        pytest.importorskip("treeflash.models.gated_deltanet")
    _, target = make_pair(arch)
    model = random_drafter(target)
    prompt = torch.randint(0, target.config.vocab_size, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    ref, _ = run(target, prompt, NUM_TOKENS)
    tree = budget != "chain"
    b = budget if tree else model.config.block_size - 1
    eager_out, eager_trees = decode(target, model, prompt, b, tree, static=False)
    static_out, static_trees = decode(target, model, prompt, b, tree, static=True)
    assert static_out == eager_out == ref
    assert [t[:2] for t in static_trees] == [t[:2] for t in eager_trees]
    # the prompt's 12 rows > block 8: all but the last absorbed at prefill, so even the first pass is static
    assert all(t[2] for t in static_trees)


def test_static_masks_for_causal_sliding_layers_and_short_prompts():
    """Sliding (causal, windowed) draft layers read the whole buffer under the static mask; a
    prompt shorter than the block takes the static pass from the first step."""
    _, target = make_pair("qwen3")
    model = random_drafter(target, layer_types=("full_attention", "sliding_attention"), sliding_window=5)
    assert model.layers[1].self_attn.causal and model.layers[1].self_attn.window == 5
    prompt = [3, 1, 4, 1, 5]
    ref, _ = run(target, prompt, NUM_TOKENS)
    eager_out, eager_trees = decode(target, model, prompt, 16, True, static=False)
    static_out, static_trees = decode(target, model, prompt, 16, True, static=True)
    assert static_out == eager_out == ref
    assert [t[:2] for t in static_trees] == [t[:2] for t in eager_trees]
    assert all(t[2] for t in static_trees)


def test_static_pass_logits_equal_eager_logits():
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    eager = DFlashDrafter(target, model, budget=8)
    static = DFlashDrafter(target, model, budget=8)
    static.static_passes(64, use_graphs=False)
    g = torch.Generator().manual_seed(0)
    width = len(model.config.target_layer_ids) * target.config.hidden_size
    for rows in (3, 8, 1, 5):  # new context rows per pass, as steps commit them
        hidden = torch.randn(rows, width, generator=g)
        ids = list(range(rows))
        eager.observe(ids, hidden)
        static.observe(ids, hidden)
        want = eager.draft_logits(7)
        p = static._static_pass(7)
        assert p is not None
        torch.testing.assert_close(p.logits, want, atol=1e-5, rtol=0)
        packed = p.packed
        d = packed.shape[0] // 2
        top_lp, top_ids = torch.log_softmax(want, -1).topk(8, dim=-1)
        torch.testing.assert_close(packed[:d].float(), top_lp, atol=1e-5, rtol=0)
        assert torch.equal(packed[d:].long(), top_ids)
    assert static.cache.length == eager.cache.length == 17


def test_sampled_requests_use_the_static_logits():
    """temperature > 0: the static pass's logits feed the sampler (no read-back shortcut); the
    same seed gives the same text as the eager pass."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    prompt = [5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    params = SamplingParams(temperature=0.8, seed=3)
    for tree, budget in ((False, 7), (True, 12)):
        eager_out, eager_trees = decode(target, model, prompt, budget, tree, static=False, params=params)
        static_out, static_trees = decode(target, model, prompt, budget, tree, static=True, params=params)
        assert static_out == eager_out
        assert [t[:2] for t in static_trees] == [t[:2] for t in eager_trees]


def test_budget_zero_steps_take_the_plain_decode_path():
    """A root-only tree (budget 0: no drafting) runs as a plain decode step (the decode graph on a
    GPU), not as a one-node verify; the drafter still sees every committed row."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    prompt = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]
    ref, _ = run(target, prompt, 40)
    cache = target.new_cache(len(prompt) + 120)
    drafter = DFlashDrafter(target, model, budget=0)
    runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(runner)
    steps = []
    forward = runner.forward
    runner.forward = lambda step, *a, **k: steps.append(step.is_verify) or forward(step, *a, **k)
    dec = Decoder(target, cache, SamplingParams(), drafter, runner=runner, device_steps=False)
    out = [dec.prefill(prompt)]
    while len(out) < 40:
        out.extend(dec.step())
    assert out[:40] == ref
    assert steps and not any(steps)  # prefill and every step: plain forwards
    assert drafter._observed == len(dec.tokens) and dec.stats.passes == 39


class StaticOutputRunner(CudaGraphRunner):
    """Like a CUDA-graph replay: every forward hands back views of the same output buffers, which
    the next forward overwrites (use_graphs=False would return fresh tensors and hide aliasing)."""

    def forward(self, step, *args, **kwargs):
        from treeflash.models.transformer import ForwardOutput

        out = super().forward(step, *args, **kwargs)
        if out.captured is None or step.num_tokens > 64:
            return out
        n = out.captured.shape[0]
        if not hasattr(self, "buf"):
            self.buf = torch.zeros(64, out.captured.shape[1])
        self.buf[:n].copy_(out.captured)
        return ForwardOutput(out.logits, out.hidden, self.buf[:n])


def test_rows_kept_over_budget_zero_steps_survive_the_next_replay():
    """Rows observed over several no-draft steps must be copies: a graph's next replay overwrites
    its output buffers. The rows the drafter holds equal a fresh capture of those tokens."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    prompt = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]
    cache = target.new_cache(len(prompt) + 64)
    drafter = DFlashDrafter(target, model, budget=0)
    runner = StaticOutputRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    dec = Decoder(target, cache, SamplingParams(), drafter, runner=runner, device_steps=False)
    dec.prefill(prompt)
    drafter._pending = []  # keep only what the steps hand over
    for _ in range(6):
        dec.step()
    held = torch.cat(drafter._pending)  # [6, C]: the roots of the 6 steps
    with torch.inference_mode():
        fresh = target(StepInput.plain(torch.tensor(dec.tokens), 0), target.new_cache(len(dec.tokens)), capture_layers=drafter.capture_layers)
    torch.testing.assert_close(held, fresh.captured[len(prompt) : len(prompt) + 6], atol=1e-5, rtol=0)


def test_observed_rows_are_views_until_a_timing_pass_would_overwrite_them():
    """An accepted prefix reaches the drafter as a view of the verify pass's captured rows (no
    gather); --budget auto's timer replays verify graphs that overwrite that buffer on a GPU, so
    the drafter copies its pending views first. (On the CPU the static passes write fresh tensors,
    so only the copy itself can be checked here.)"""
    from treeflash.spec.decoder import _rows

    _, target = make_pair("qwen3")
    model = random_drafter(target)
    captured = torch.randn(8, 2 * target.config.hidden_size)
    chain, tree = _rows(captured, [0, 1, 2]), _rows(captured, [0, 2, 5])
    assert chain._base is captured and chain.data_ptr() == captured.data_ptr()
    assert tree._base is None and torch.equal(tree, captured[[0, 2, 5]])
    cache = target.new_cache(64)
    drafter = DFlashDrafter(target, model, budget="auto")
    runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(runner)
    drafter.observe([1, 2, 3], chain)
    assert drafter._pending[0].data_ptr() == captured.data_ptr()
    drafter.tuner.measure(3)
    kept = drafter._pending[0]
    assert kept.data_ptr() != captured.data_ptr() and torch.equal(kept, captured[:3])
