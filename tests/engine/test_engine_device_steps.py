"""The engine over device steps (spec/device_step.py; the static code run eagerly on the CPU, as the
CUDA-graph runner does on a GPU): steps commit several tokens and the device runs one step ahead
of the host, yet max_tokens, stop strings and EOS cut exactly where plain decoding does, and the
next request starts clean."""

from __future__ import annotations

from tests.engine.toy import toy_loaded
from tests.spec.test_dflash_model import random_drafter
from tests.spec.test_device_step import oracle
from treeflash.engine.engine import Engine, EngineConfig
from treeflash.engine.request import GenerationRequest
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.dflash import DFlashDrafter

PROMPT = tuple(range(5, 17))


def req(**kw):
    base = dict(prompt_ids=PROMPT, max_tokens=60, ignore_eos=True)
    base.update(kw)
    return GenerationRequest(**base)


def engines():
    loaded = toy_loaded()
    plain = Engine(loaded, EngineConfig(max_context=256))
    _, ref, _ = plain.complete(req(max_tokens=120))
    dev = Engine(loaded, EngineConfig(max_context=256))
    target = loaded.model
    drafter = DFlashDrafter(target, random_drafter(target), budget=12, tree=True)
    dev.drafter = drafter
    dev.runner = CudaGraphRunner(target, dev.cache, capture_layers=drafter.capture_layers, use_graphs=False)
    drafter.bind_runner(dev.runner)
    assert drafter.device_step is not None
    oracle(drafter, drafter.device_step, list(PROMPT) + ref)  # mostly right drafts: several tokens a step
    return plain, dev, ref


def test_cuts_match_plain_decoding():
    plain, dev, ref = engines()
    for n in (1, 2, 7, 13, 60):
        _, ids, last = dev.complete(req(max_tokens=n))
        assert ids == ref[:n] and last.usage.completion_tokens == n and last.finish_reason == "length"
    assert last.usage.spec["tau"] > 2.0  # the steps did commit several tokens
    full, _, _ = plain.complete(req())
    stop = full[20:23]
    text, _, last = dev.complete(req(stop=(stop,)))
    assert text == full[: full.find(stop)] and last.finish_reason == "stop"
    dev.eos_ids = plain.eos_ids = {ref[9]}
    _, ids, last = dev.complete(req(ignore_eos=False))
    assert ids == ref[: ref.index(ref[9]) + 1] and last.finish_reason == "stop"


def test_stream_equals_complete_over_device_steps():
    plain, dev, ref = engines()
    events = list(dev.stream(req()))
    assert [t for e in events for t in e.token_ids] == ref[:60]
    text, _, _ = plain.complete(req())
    assert "".join(e.text for e in events) == text
    assert sum(e.finish_reason is not None for e in events) == 1
    assert any(len(e.token_ids) > 1 for e in events)


def test_constrained_requests_fall_back_to_host_steps_and_stay_constrained():
    """A grammar (or min_tokens) never rides the device loop, which has no masks: the drafted steps run
    on the host, the output matches the regex and equals plain constrained decoding."""
    import re

    from treeflash.engine.request import Grammar

    plain, dev, ref = engines()

    def no_device_loop(*args, **kwargs):
        raise AssertionError("a constrained request asked for the device loop")

    dev.drafter.device_loop = no_device_loop
    pattern = "[a-h ]{4,30}[.]"
    grammar = Grammar("regex", pattern)
    text, ids, last = dev.complete(req(ignore_eos=False, grammar=grammar))
    assert re.fullmatch(pattern, text) and last.finish_reason == "stop"
    assert plain.complete(req(ignore_eos=False, grammar=grammar))[:2] == (text, ids)
    dev.eos_ids = plain.eos_ids = {ref[9]}  # an end token the output reaches early: min_tokens holds it back
    held = req(ignore_eos=False, min_tokens=30, max_tokens=40)
    _, ids, _ = dev.complete(held)
    assert ids == plain.complete(held)[1] and ref[9] not in ids[:30] and len(ids) >= 30
