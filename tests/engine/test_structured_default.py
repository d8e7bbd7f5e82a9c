"""Structured outputs on the default model (SmolLM2-135M-Instruct): JSON that validates against each of
twenty schemas (jsonschema as the oracle), token-identical with and without speculation at temperature
0 (ngram on all twenty, the shipped DFlash drafter on a few), plus a regex and a choice; min_tokens
holds the end token back, also under speculation."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from tests.engine.schemas import SCHEMAS
from treeflash.engine.chat import render_chat
from treeflash.engine.engine import Engine, EngineConfig
from treeflash.engine.request import GenerationRequest, Grammar

pytestmark = pytest.mark.slow

_ENGINES: dict[str | None, Engine] = {}


def engine(draft: str | None) -> Engine:
    if draft not in _ENGINES:
        from treeflash.models.loader import load_model

        torch.set_num_threads(1)
        loaded = _ENGINES[None].loaded if None in _ENGINES else load_model(None, device="cpu", progress=False)
        _ENGINES[draft] = Engine(loaded, EngineConfig(max_context=1024, draft=draft))
    return _ENGINES[draft]


def chat_ids(eng: Engine, text: str) -> tuple[int, ...]:
    prompt = render_chat(eng.loaded.chat_template, [{"role": "user", "content": text}], add_generation_prompt=True)
    return tuple(eng.encode(prompt, add_special_tokens=False))


def run(draft: str | None, text: str, grammar: Grammar | None, max_tokens: int = 96, **kw):
    eng = engine(draft)
    return eng.complete(GenerationRequest(chat_ids(eng, text), max_tokens=max_tokens, grammar=grammar, **kw))


def test_twenty_schemas_valid_and_identical_with_ngram():
    engine(None)
    for prompt, schema in SCHEMAS:
        g = Grammar("json_schema", json.dumps(schema))
        text, ids, last = run(None, prompt + " Answer in JSON.", g)
        assert last.finish_reason == "stop", (prompt, text)
        jsonschema.validate(json.loads(text), schema)
        spec_text, spec_ids, _ = run("ngram", prompt + " Answer in JSON.", g)
        assert (spec_text, spec_ids) == (text, ids), prompt


@pytest.mark.parametrize("case", [0, 7, 11])
def test_dflash_constrained_equals_plain(case):
    prompt, schema = SCHEMAS[case]
    g = Grammar("json_schema", json.dumps(schema))
    assert run("dflash", prompt, g)[:2] == run(None, prompt, g)[:2]


def test_regex_and_choice():
    text, ids, last = run("ngram", "What is the phone number of the pizza place?", Grammar("regex", r"\(\d{3}\) \d{3}-\d{4}"))
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", text) and last.finish_reason == "stop"
    assert run(None, "What is the phone number of the pizza place?", Grammar("regex", r"\(\d{3}\) \d{3}-\d{4}"))[:2] == (text, ids)
    choice = Grammar("choice", json.dumps(["positive", "negative"]))
    text, _, last = run("dflash", "Sentiment of 'I loved it!'?", choice)
    assert text in ("positive", "negative") and last.finish_reason == "stop"


def test_min_tokens_holds_the_end_back():
    free, free_ids, last = run(None, "Say hi.", None, max_tokens=64)
    assert last.finish_reason == "stop" and len(free_ids) < 30  # it would end on its own
    n = len(free_ids) + 10
    text, ids, last = run(None, "Say hi.", None, max_tokens=64, min_tokens=n)
    assert len(ids) >= n + (last.finish_reason == "stop") and ids[: len(free_ids) - 1] == free_ids[:-1]
    assert run("ngram", "Say hi.", None, max_tokens=64, min_tokens=n)[:2] == (text, ids)
