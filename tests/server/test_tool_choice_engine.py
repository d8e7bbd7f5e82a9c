"""A forced tool_choice end to end: the app over the real engine on a random tiny model (one token per
ASCII character, a Qwen-style template without thinking), in both tool-call forms. On every route,
"required" and a named choice, at temperature 0 and sampled, the reply is a tool-call reply (finish
"tool_calls", stop_reason "tool_use", function_call items) whose calls name allowed tools and whose
arguments validate against the tool's schema (jsonschema as the oracle); one call exactly when
parallel calls are off. With the ngram drafter the output is token-identical to plain decoding."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from tests.engine.toy import ToyLoaded
from tests.models.hf_oracle import make_pair
from tests.server.scripted import TEMPLATE, AsciiTokenizer
from tests.server.test_cli_serve import served
from treeflash.engine.engine import Engine, EngineConfig

NO_THINK = TEMPLATE.replace("{% if enable_thinking %}<think>\n{% endif %}", "")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                            "hourly": {"type": "boolean"}}, "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
ASK = [{"role": "user", "content": "Weather in Paris, and the time?"}]
MAX_TOKENS = 300  # one call of the longest tool in the xml form is under 200 characters (= tokens)


class RecordingEngine(Engine):
    """The real engine; keeps every GenerationRequest the server built."""

    def __init__(self, loaded, config):
        super().__init__(loaded, config)
        self.requests = []

    def stream(self, req, cancelled=None):
        self.requests.append(req)
        yield from super().stream(req, cancelled)


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(1)
    _, model = make_pair("qwen3", max_position_embeddings=2048)
    return ToyLoaded(model, AsciiTokenizer(), model.config, NO_THINK)


@pytest.fixture(scope="module", params=["json", "xml"])
def server(request, loaded):
    """(form, openai client, TestClient, engine)."""
    engine = RecordingEngine(loaded, EngineConfig(max_context=1024))
    with served("--served-model-name", "toy", "--tool-call-parser", request.param, engine=engine) as (client, http, _):
        yield request.param, client, http, engine


def check_calls(calls: list[tuple[str, dict]], allowed: set[str], exactly_one: bool) -> None:
    assert calls and (len(calls) == 1 or not exactly_one), calls
    for name, args in calls:
        assert name in allowed, name
        jsonschema.validate(args, SCHEMAS[name])


CHOICES = [("required", None), ("named", "get_time"), ("named", "get_weather")]


def chat_choice(name):
    return "required" if name is None else {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind,name", CHOICES)
def test_chat_completions(server, kind, name, temperature):
    form, client, _, _ = server
    allowed = set(SCHEMAS) if name is None else {name}
    for single in (True, False):
        r = client.chat.completions.create(model="toy", messages=ASK, tools=CHAT_TOOLS, tool_choice=chat_choice(name),
                                           parallel_tool_calls=not single, max_tokens=MAX_TOKENS, temperature=temperature, seed=5)
        choice = r.choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        check_calls(calls, allowed, single)
        if single:  # the grammar ends after one call: the end token is all it allows
            assert choice.finish_reason == "tool_calls" and not choice.message.content, (form, choice)
    chunks = client.chat.completions.create(model="toy", messages=ASK, tools=CHAT_TOOLS, tool_choice=chat_choice(name), stream=True,
                                            parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=temperature, seed=5)
    streamed, finish = {}, None
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            acc = streamed.setdefault(d.index, ["", ""])
            acc[0] += d.function.name or ""
            acc[1] += d.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    check_calls([(n, json.loads(a)) for n, a in streamed.values()], allowed, True)
    assert finish == "tool_calls"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind,name", CHOICES)
def test_responses(server, kind, name, temperature):
    _, _, http, _ = server
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    choice = "required" if name is None else {"type": "function", "name": name}
    body = {"model": "toy", "input": ASK[0]["content"], "tools": tools, "tool_choice": choice, "parallel_tool_calls": False,
            "max_output_tokens": MAX_TOKENS, "temperature": temperature, "store": False}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    assert out["status"] == "completed" and [o["type"] for o in out["output"]] == ["function_call"], out["output"]
    check_calls([(o["name"], json.loads(o["arguments"])) for o in out["output"]], set(SCHEMAS) if name is None else {name}, True)
    assert out["tool_choice"] == choice


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind,name", CHOICES)
def test_messages(server, kind, name, temperature):
    _, _, http, _ = server
    tools = [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()]
    for single in (True, False):
        choice = {"type": "any"} if name is None else {"type": "tool", "name": name}
        body = {"model": "toy", "max_tokens": MAX_TOKENS, "messages": ASK, "tools": tools, "temperature": temperature,
                "tool_choice": {**choice, "disable_parallel_tool_use": single}}
        r = http.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text[:300]
        out = r.json()
        uses = [(b["name"], b["input"]) for b in out["content"] if b["type"] == "tool_use"]
        check_calls(uses, set(SCHEMAS) if name is None else {name}, single)
        if single:
            assert out["stop_reason"] == "tool_use" and [b["type"] for b in out["content"]] == ["tool_use"], out


def test_the_ngram_drafter_gives_the_same_tokens(server, loaded):
    form, client, _, engine = server
    for name in (None, "get_weather"):
        for single in (True, False):
            client.chat.completions.create(model="toy", messages=ASK, tools=CHAT_TOOLS, tool_choice=chat_choice(name),
                                           parallel_tool_calls=not single, max_tokens=MAX_TOKENS, temperature=0)
    requests = engine.requests[-4:]
    assert all(r.grammar is not None and r.grammar.param == "tools" for r in requests)
    drafted = Engine(loaded, EngineConfig(max_context=1024, draft="ngram"))
    for req in requests:
        plain_text, plain_ids, _ = engine.complete(req)
        assert drafted.complete(req)[:2] == (plain_text, plain_ids), (form, req.grammar.source[:200])
    assert sum(drafted.totals.accepted_per_depth) > 0  # the drafter's proposals were taken, not only plain steps


@pytest.mark.slow
def test_the_default_model_makes_a_valid_call_when_required():
    """SmolLM2 (a template that does not render tools: the Hermes block, the json form): "required"
    gives one valid call, token-identical under ngram."""
    from treeflash.models.loader import load_model

    loaded = load_model(None, device="cpu", progress=False)
    engine = RecordingEngine(loaded, EngineConfig(max_context=1024))
    ask = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
    with served(engine=engine) as (client, _, _):
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=ask, tools=CHAT_TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    check_calls([(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls], set(SCHEMAS), True)
    drafted = Engine(loaded, EngineConfig(max_context=1024, draft="ngram"))
    assert drafted.complete(engine.requests[-1])[:2] == engine.complete(engine.requests[-1])[:2]
