"""Greedy DFlash steps run on the device (DeviceStep: one CUDA graph per step on a GPU, the same code
run eagerly here), chains and DDTrees: token-identical to plain decoding and to the synchronous
steps, with the same statistics; the loop hands the drafter back its state when the context runs
short."""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.test_dflash_model import random_drafter
from tests.spec.test_lossless_greedy import run
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.device_step import DeviceStep
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.sampling import SamplingParams

PROMPT = [5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
N = 90


def setup(target, model, max_len, budget="chain"):
    cache = target.new_cache(max_len)
    tree = budget != "chain"
    drafter = DFlashDrafter(target, model, budget=budget if tree else model.config.block_size - 1, tree=tree)  # "auto": a tree
    runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(runner)
    return cache, drafter, runner


def decode(target, cache, drafter, runner, prompt, n, calls=None, device_steps=True):
    """-> (tokens, stats, kinds): kinds[i] is 'device' or 'sync' for step i."""
    dec = Decoder(target, cache, SamplingParams(), drafter, runner=runner, device_steps=device_steps)
    out = [dec.prefill(prompt)]
    kinds = []
    while len(out) < n:
        before = len(calls) if calls is not None else 0
        out.extend(dec.step())
        kinds.append("device" if calls is not None and len(calls) > before or dec._dev_cur is not None else "sync")
    return out[:n], dec.stats, kinds, dec


def count_enqueues(monkeypatch):
    calls = []
    enqueue = DeviceStep.enqueue
    monkeypatch.setattr(DeviceStep, "enqueue", lambda self: calls.append(1) or enqueue(self))
    return calls


def oracle(drafter, step, reference: list[int], corrupt_every: int = 3):
    """Make the device pass draft the reference continuation at rank 0, every `corrupt_every`-th
    position wrong there and right at rank 1 (a DDTree's second-best sibling finds it), so that steps
    accept 0 .. B-1 drafts (a random drafter on a random target accepts ~nothing)."""
    g = drafter.graphs
    ref = torch.tensor(reference + [0] * 64)
    vocab = drafter.target.config.vocab_size
    real = g.device_pass

    def device_pass(count):
        top_lp, top_ids = real(count)
        d, k = top_ids.shape
        idx = step.state[0:1] + 1 + torch.arange(d)
        right = ref.gather(0, idx)
        wrong = (right + 1) % vocab
        bad = idx % corrupt_every == 0
        ids = (right[:, None] + 2 + torch.arange(k)[None, :]) % vocab  # fillers, distinct per depth
        ids[:, 0] = torch.where(bad, wrong, right)
        if k > 1:
            ids[:, 1] = torch.where(bad, right, wrong)
        lp = torch.cat((torch.tensor([-0.01, -0.5], dtype=torch.float64), -5.0 - torch.arange(max(k - 2, 0), dtype=torch.float64)))[:k]
        return (lp[None, :] - 0.001 * torch.arange(d)[:, None]).contiguous(), ids  # rank 1 before any rank 2

    g.device_pass = device_pass


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5", "llama"])
@pytest.mark.parametrize("budget", ["chain", 6, 22])
def test_device_steps_equal_the_synchronous_steps(arch, budget, monkeypatch):
    if arch == "qwen3_5":
        pytest.importorskip("treeflash.models.gated_deltanet")
    _, target = make_pair(arch)
    model = random_drafter(target)
    ref, _ = run(target, PROMPT, N)
    calls = count_enqueues(monkeypatch)
    out, stats, kinds, _ = decode(target, *setup(target, model, len(PROMPT) + N + 80, budget), PROMPT, N, calls)
    sync_out, sync_stats, _, dec = decode(target, *setup(target, model, len(PROMPT) + N + 80, budget), PROMPT, N, device_steps=False)
    assert dec._dev is None
    assert out == sync_out == ref
    # the prompt's 12 rows > B = 8: all but the last went into the draft cache at prefill (DFlashDrafter._absorb_excess),
    # so the device loop starts at the first step
    assert kinds and all(k == "device" for k in kinds)
    assert (stats.passes, stats.committed, stats.nodes, stats.proposed_per_depth, stats.accepted_per_depth) == (
        sync_stats.passes, sync_stats.committed, sync_stats.nodes, sync_stats.proposed_per_depth, sync_stats.accepted_per_depth)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5", "qwen3-folded"])
def test_accepted_drafts_commit_exactly(arch):
    """Drafts that are mostly right: steps accept several nodes, the caches commit along the accepted
    path on the device (through second-best siblings in a tree), and the output stays the target's
    own. The chain stops at each wrong rank-0 draft; the tree goes on through its siblings.
    qwen3-folded: the verify runs the folded-norm layers (forward_folded) in the static code, the
    rotary kernel's reference applying the input norm's 1 / rms."""
    if arch == "qwen3_5":
        pytest.importorskip("treeflash.models.gated_deltanet")
    _, target = make_pair(arch.removesuffix("-folded"))
    model = random_drafter(target)
    ref, _ = run(target, PROMPT, N + 40)
    if arch.endswith("-folded"):
        target.fuse_projections(folded_rows=64)
    taus = {}
    for budget in ("chain", 22):
        cache, drafter, runner = setup(target, model, len(PROMPT) + N + 80, budget)
        dec = Decoder(target, cache, SamplingParams(), drafter, runner=runner)
        dec.prefill(PROMPT)  # builds the device step
        oracle(drafter, drafter.device_step, PROMPT + ref)
        out, stats, kinds, _ = decode(target, cache, drafter, runner, PROMPT, N)
        assert out == ref[:N]
        assert kinds.count("device") >= len(kinds) - 1
        taus[budget] = stats.tau
    assert taus["chain"] > 2.0 and taus[22] > taus["chain"] + 0.3


def test_the_loop_ends_when_the_context_runs_short(monkeypatch):
    """Near max_len the loop stops enqueueing, hands the drafter its rows, length and count back,
    and synchronous steps finish the sequence, still identical to plain decoding."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    ref, _ = run(target, PROMPT, 60)
    calls = count_enqueues(monkeypatch)
    cache, drafter, runner = setup(target, model, len(PROMPT) + 62)
    verifies = []  # the synchronous steps' verify passes, numbered by the enqueues before them
    forward = runner.forward
    runner.forward = lambda step, *a, **k: (verifies.append(len(calls)) if step.is_verify else None) or forward(step, *a, **k)
    out, _, kinds, dec = decode(target, cache, drafter, runner, PROMPT, 60, calls)
    assert out == ref
    # the loop from the first step (the prompt's rows absorbed at prefill), then synchronous steps only
    assert len(calls) > 3 and verifies and all(v == len(calls) for v in verifies)
    assert drafter._observed == len(dec.tokens) and cache.seq_len == len(dec.tokens)


def test_sequences_back_to_back_reuse_the_chain(monkeypatch):
    """A second sequence on the same runner and drafter (a server's next request) starts clean even
    when the first one ended with a step still enqueued."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    cache, drafter, runner = setup(target, model, 200, 10)
    other = [7, 7, 1, 2, 3, 4, 5, 6, 1, 1, 2]
    first, _, _, dec1 = decode(target, cache, drafter, runner, PROMPT, 30)
    assert dec1._dev_cur is not None  # left in flight
    step = drafter.device_step
    second, _, _, _ = decode(target, cache, drafter, runner, other, 50)
    assert drafter.device_step is step
    assert first == run(target, PROMPT, 30)[0] and second == run(target, other, 50)[0]


def test_padded_pass_equals_the_exact_pass():
    """forward_static with `count` real rows out of B padded ones equals the pass over exactly those
    rows: the padding rows go to the buffer's last slot, which no query sees."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    c = model.config
    width = len(c.target_layer_ids) * target.config.hidden_size
    g = torch.Generator().manual_seed(1)
    block = torch.randn(c.block_size, target.config.hidden_size, generator=g)
    for n, start in ((1, 0), (3, 5), (c.block_size, 9)):
        rows = torch.randn(c.block_size, width, generator=g)
        outs = []
        for count in (None, torch.tensor([n])):
            cache = model.new_cache()
            cache.reserve(64)
            key_pos = torch.arange(cache.k[0].shape[0])
            ctx = rows[:n] if count is None else rows
            with torch.inference_mode():
                outs.append(model.forward_static(ctx, block, cache, torch.tensor([start]), key_pos, count))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)


def price(monkeypatch, plain_s: float, device_s: float) -> None:
    """Price --budget auto's two arms on the device: a plain step and a device step (measured step times
    ignored, so that the test decides which wins)."""
    monkeypatch.setattr(DeviceStep, "_times", lambda self, n: {1: plain_s, self.t: device_s})
    monkeypatch.setattr(DeviceStep, "timed", lambda self, s: None)


def test_auto_budget_on_the_device_follows_its_bandit(monkeypatch):
    """--budget auto: greedy steps run on the device at AUTO_BUDGET nodes while they win; when a plain
    step is priced far cheaper, the request's bandit turns to plain steps (which still feed the drafter)
    and probes the device step again within its floor, and the output stays token-identical."""
    from treeflash.spec import device_step

    _, target = make_pair("qwen3")
    model = random_drafter(target)
    ref, _ = run(target, PROMPT, N)
    cache, drafter, runner = setup(target, model, len(PROMPT) + N + 80, "auto")
    assert drafter.tuner is not None
    calls = count_enqueues(monkeypatch)
    price(monkeypatch, plain_s=1.0, device_s=1e-6)  # device steps win even accepting nothing
    out, stats, kinds, dec = decode(target, cache, drafter, runner, PROMPT, 30, calls)
    assert out == ref[:30] and dec._dev.t == device_step.AUTO_BUDGET + 1 and len(calls) >= len(kinds) - 1
    assert drafter.describe()["device_step_budget"] == device_step.AUTO_BUDGET
    assert stats.steps_per_budget.get(device_step.AUTO_BUDGET, 0) >= len(kinds) - 1
    price(monkeypatch, plain_s=1e-6, device_s=1.0)  # now a plain step is a million times cheaper
    calls.clear()
    out, stats, kinds, dec = decode(target, cache, drafter, runner, PROMPT, N, calls)
    assert out == ref
    plain = stats.steps_per_budget.get(0, 0)
    assert plain > 0.8 * stats.passes, stats.steps_per_budget
    # the floor: a probe at the first step and again within twice probe_every steps (each losing probe
    # doubles the interval, up to max_probe_every)
    first_probes = [i for i, b in enumerate(stats.budget_sequence) if b][:2]
    assert first_probes[0] == 0 and first_probes[1] <= 2 * drafter.tuner.config.probe_every + 1, stats.budget_sequence


def test_auto_on_the_device_recovers_across_requests(monkeypatch):
    """--budget auto across requests carries only a prior: after requests whose device steps lost (every
    step priced as a loss), a request where they win drafts again from its first steps (no lock-out)."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    ref, _ = run(target, PROMPT, 40)
    cache, drafter, runner = setup(target, model, len(PROMPT) + N + 80, "auto")
    calls = count_enqueues(monkeypatch)
    price(monkeypatch, plain_s=1e-6, device_s=1.0)
    for _ in range(3):
        calls.clear()
        out, stats, _, _ = decode(target, cache, drafter, runner, PROMPT, 40, calls)
        assert out == ref and stats.steps_per_budget.get(0, 0) > 0.7 * stats.passes
    price(monkeypatch, plain_s=1.0, device_s=1e-6)  # now they win
    calls.clear()
    out, stats, kinds, dec = decode(target, cache, drafter, runner, PROMPT, 40, calls)
    assert out == ref
    assert stats.budget_sequence[:3] == [dec._dev.t - 1] * 3, stats.budget_sequence


@pytest.mark.parametrize("types", [("q8_0", "q4_0"), ("tq3_0", "q8_0")])
def test_compressed_caches_commit_on_the_device(types, monkeypatch):
    """Compressed KV caches: device DDTree steps (mostly right drafts, so paths through siblings are
    committed with the caches' own row moves) equal the synchronous steps and plain decoding over
    the same cache types."""
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    k, v = types

    def with_types(max_len, budget):
        cache = target.new_cache(max_len, k, v)
        drafter = DFlashDrafter(target, model, budget=budget, tree=True)
        runner = CudaGraphRunner(target, cache, capture_layers=drafter.capture_layers, use_graphs=False)
        drafter.bind_runner(runner)
        return cache, drafter, runner

    plain_cache = target.new_cache(len(PROMPT) + N + 80, k, v)
    dec = Decoder(target, plain_cache, SamplingParams())
    ref = [dec.prefill(PROMPT)]
    while len(ref) < N + 40:
        ref.extend(dec.step())
    outs = []
    for device in (True, False):
        cache, drafter, runner = with_types(len(PROMPT) + N + 80, 12)
        if device:
            oracle(drafter, drafter.device_step, PROMPT + ref)
        out, stats, _, _ = decode(target, cache, drafter, runner, PROMPT, N, device_steps=device)
        outs.append(out)
        if device:
            assert stats.tau > 2.0
    assert outs[0] == outs[1] == ref[:N]


def test_a_device_step_that_fails_to_build_leaves_synchronous_steps(monkeypatch):
    """Any failure building the device step (a capture, or a kernel that does not compile: triton raises
    its own exception types) warns and keeps the synchronous steps, which stay exact."""
    import treeflash.spec.dflash as dflash_mod

    def broken(*args, **kwargs):
        raise ValueError("kernel did not compile")

    monkeypatch.setattr(dflash_mod, "DeviceStep", broken)
    _, target = make_pair("qwen3")
    model = random_drafter(target)
    with pytest.warns(UserWarning, match="ValueError: kernel did not compile"):
        cache, drafter, runner = setup(target, model, len(PROMPT) + N + 80, 6)
    assert drafter.device_step is None
    out, _, _, dec = decode(target, cache, drafter, runner, PROMPT, 40)
    assert out == run(target, PROMPT, 40)[0]
    # a sampled request builds its own device step lazily: the same fallback, warned once, not retried
    params = SamplingParams(temperature=1.0, seed=3)
    with pytest.warns(UserWarning, match="device_step_sampled: building the device step failed"):
        dec = Decoder(target, cache, params, drafter, runner=runner)
        dec.prefill(PROMPT)
    assert dec._dev is None and "device_step_sampled" in drafter.device_step_failed
    while len(dec.tokens) < len(PROMPT) + 20:
        dec.step()
    dec2 = Decoder(target, cache, params, drafter, runner=runner)
    dec2.prefill(PROMPT)
    assert dec2._dev is None
