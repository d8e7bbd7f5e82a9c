"""The engine's stream: multi-token deltas, max_tokens, EOS, stop strings, seeds; complete() == stream()."""

import torch

from tests.engine.toy import toy_loaded
from treeflash.engine.engine import Engine, EngineConfig
from treeflash.engine.request import GenerationRequest
from treeflash.spec.drafter import DraftOptions
from treeflash.spec.sampling import SamplingParams


def req(**kw):
    base = dict(prompt_ids=tuple(range(5, 17)), max_tokens=40, ignore_eos=True)
    base.update(kw)
    return GenerationRequest(**base)


def test_stream_equals_complete_and_plain_equals_ngram():
    loaded = toy_loaded()
    plain = Engine(loaded, EngineConfig(max_context=256))
    spec = Engine(loaded, EngineConfig(max_context=256, draft="ngram", draft_options=DraftOptions(num_draft=4)))
    r = req()
    text_p, ids_p, last_p = plain.complete(r)
    events = list(spec.stream(r))
    assert "".join(e.text for e in events) == text_p
    assert [t for e in events for t in e.token_ids] == ids_p
    assert len(ids_p) == 40 and last_p.finish_reason == "length" and last_p.usage.completion_tokens == 40
    assert sum(e.finish_reason is not None for e in events) == 1


def test_max_tokens_is_exact_with_multi_token_steps():
    loaded = toy_loaded()
    spec = Engine(loaded, EngineConfig(max_context=256, draft="ngram"))
    for n in (1, 2, 7, 13):
        _, ids, last = spec.complete(req(max_tokens=n, prompt_ids=tuple([3, 4, 5] * 6)))
        assert len(ids) == n and last.usage.completion_tokens == n


def test_stop_string_cuts_text():
    loaded = toy_loaded()
    eng = Engine(loaded, EngineConfig(max_context=256))
    full, _, _ = eng.complete(req())
    stop = full[10:13]
    text, _, last = eng.complete(req(stop=(stop,)))
    assert text == full[: full.find(stop)] and last.finish_reason == "stop"


def test_eos_ends_generation():
    loaded = toy_loaded()
    eng = Engine(loaded, EngineConfig(max_context=256))
    _, ids, _ = eng.complete(req())
    eng.eos_ids = {ids[5]}
    _, ids2, last = eng.complete(req(ignore_eos=False))
    assert ids2 == ids[: ids.index(ids[5]) + 1] and last.finish_reason == "stop"


def test_seed_reproducible_and_logprobs():
    loaded = toy_loaded()
    eng = Engine(loaded, EngineConfig(max_context=256, draft="ngram"))
    s = SamplingParams(temperature=1.0, seed=123)
    a = eng.complete(req(sampling=s, logprobs=2))
    b = eng.complete(req(sampling=s, logprobs=2))
    assert a[1] == b[1]
    lps = [lp for e in eng.stream(req(sampling=s, logprobs=2)) for lp in e.logprobs]
    assert [lp.token_id for lp in lps] == a[1]
    assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in lps)
