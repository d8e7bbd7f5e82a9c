"""Structured outputs and min_tokens on the wire (server/structured.py).

In-process over the stub engine: every accepted form reaches the engine as one Grammar (or none for
text); every field the server does not handle is a 400 naming it (never silence), in each route's
envelope; /metrics counts constrained requests. On the live toy server (the real engine over a random
model, one token per ASCII character): a regex and a choice hold, streamed and not. On the live default
model (slow): json_schema through the openai client gives JSON valid against the schema.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.server.live import MODEL
from tests.server.stub_app import KEY, stub_client
from treeflash.server.structured import vllm_fields

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def app():
    with stub_client() as tc:
        yield tc


def chat(**kw):
    return {"model": "toy", "messages": HI, "max_tokens": 4, **kw}


GOOD = [
    ("text", chat(response_format={"type": "text"})),
    ("json_object", chat(response_format={"type": "json_object"})),
    ("json_schema", chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}})),
    ("structured_outputs json", chat(structured_outputs={"json": SCHEMA})),
    ("structured_outputs json as text", chat(structured_outputs={"json": json.dumps(SCHEMA)})),
    ("structured_outputs regex", chat(structured_outputs={"regex": "[a-z]+"})),
    ("structured_outputs choice", chat(structured_outputs={"choice": ["yes", "no"]})),
    ("structured_outputs lark", chat(structured_outputs={"grammar": 'start: "a" | "b"'})),
    ("structured_outputs gbnf", chat(structured_outputs={"grammar": 'root ::= "a" [0-9]+'})),
    ("structured_outputs json_object", chat(structured_outputs={"json_object": True, "backend": "guidance"})),
    ("guided_json", chat(guided_json=SCHEMA)),
    ("guided_regex", chat(guided_regex="[0-9]{3}", guided_decoding_backend="auto")),
    ("guided_choice", chat(guided_choice=["a", "b"])),
    ("guided_grammar", chat(guided_grammar='start: "x"+')),
    ("min_tokens", chat(min_tokens=2)),
    ("completions guided_regex", {"model": "toy", "prompt": "hi", "max_tokens": 4, "guided_regex": "[ab]+", "min_tokens": 1}),
]


@pytest.mark.parametrize("name,body", GOOD, ids=[g[0] for g in GOOD])
def test_accepted_forms(app, name, body):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = app.post(path, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text[:300]


BAD = [  # (name, body, the param the error names)
    ("response_format unknown type", chat(response_format={"type": "xml"}), "response_format.type"),
    ("response_format a string", chat(response_format="json"), "response_format"),
    ("json_schema without schema", chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema"),
    ("json_schema without name", chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
     "response_format.json_schema.name"),
    ("json_schema missing", chat(response_format={"type": "json_schema"}), "response_format.json_schema"),
    ("schema keyword not implemented", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"not": {"type": "string"}}}}), "response_format.json_schema.schema"),
    ("schema unknown format", chat(guided_json={"type": "string", "format": "bogus"}), "guided_json"),
    ("schema not JSON", chat(structured_outputs={"json": "{nope"}), "structured_outputs.json"),
    ("regex invalid", chat(guided_regex="(unclosed"), "guided_regex"),
    ("grammar invalid", chat(structured_outputs={"grammar": "start: nothing_here"}), "structured_outputs.grammar"),
    ("choice empty", chat(guided_choice=[]), "guided_choice"),
    ("choice not strings", chat(structured_outputs={"choice": [1, 2]}), "structured_outputs.choice"),
    ("structural_tag", chat(structured_outputs={"structural_tag": "{}"}), "structured_outputs.structural_tag"),
    ("whitespace_pattern", chat(structured_outputs={"json": SCHEMA, "whitespace_pattern": " "}),
     "structured_outputs.whitespace_pattern"),
    ("guided_whitespace_pattern", chat(guided_json=SCHEMA, guided_whitespace_pattern=" "), "guided_whitespace_pattern"),
    ("another backend", chat(guided_regex="a", guided_decoding_backend="xgrammar"), "guided_decoding_backend"),
    ("structured_outputs not an object", chat(structured_outputs="json"), "structured_outputs"),
    ("two constraints", chat(response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    ("two keys of structured_outputs", chat(structured_outputs={"regex": "a", "choice": ["a"]}), "structured_outputs.choice"),
    ("ignore_eos with a grammar", chat(guided_regex="a", ignore_eos=True), "ignore_eos"),
    ("min_tokens negative", chat(min_tokens=-1), "min_tokens"),
    ("min_tokens over max_tokens", chat(min_tokens=5), "min_tokens"),
    ("min_tokens a string", chat(min_tokens="2"), "min_tokens"),
]


@pytest.mark.parametrize("name,body,param", BAD, ids=[b[0] for b in BAD])
def test_unsupported_fields_are_400s_naming_them(app, name, body, param):
    r = app.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


def test_responses_and_messages_take_their_own_fields(app):
    headers = {"Authorization": f"Bearer {KEY}"}
    fmt = {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}
    r = app.post("/v1/responses", json={"model": "toy", "input": "hi", "max_output_tokens": 4, "text": {"format": fmt}}, headers=headers)
    assert r.status_code == 200 and r.json()["text"]["format"] == fmt  # echoed as sent
    r = app.post("/v1/responses", json={"model": "toy", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                                                           "schema": {"not": {}}}}}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format.schema"
    body = {"model": "toy", "max_tokens": 4, "messages": HI, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    assert app.post("/v1/messages", json=body, headers=headers).status_code == 200
    body["output_config"] = {"format": {"type": "json_schema", "schema": {"type": "string", "format": "bogus"}}}
    r = app.post("/v1/messages", json=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error" and "output_config.format.schema" in r.text


def test_metrics_count_constrained_requests(app):
    headers = {"Authorization": f"Bearer {KEY}"}

    def count(kind: str) -> float:
        text = app.get("/metrics").text
        m = re.search(rf'treeflash_constrained_requests_total{{kind="{kind}"}} ([0-9.]+)', text)
        return float(m.group(1)) if m else 0.0

    before = count("regex"), count("min_tokens")
    assert app.post("/v1/chat/completions", json=chat(guided_regex="[a-z]+", min_tokens=1), headers=headers).status_code == 200
    assert (count("regex"), count("min_tokens")) == (before[0] + 1, before[1] + 1)


def test_vllm_fields_null_and_false_mean_absent():
    assert vllm_fields({"json": None, "json_object": False}, {"guided_regex": None}) is None


def test_live_toy_engine_holds_a_regex_and_a_choice(toy_client):
    r = toy_client.chat.completions.create(model="toy", messages=HI, max_tokens=40, temperature=1.0, seed=3,
                                           extra_body={"guided_regex": "[a-c]{2,6}x"})
    assert re.fullmatch("[a-c]{2,6}x", r.choices[0].message.content) and r.choices[0].finish_reason == "stop"
    chunks = toy_client.chat.completions.create(model="toy", messages=HI, max_tokens=40, stream=True,
                                                extra_body={"structured_outputs": {"choice": ["alpha", "beta gamma"]}})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in ("alpha", "beta gamma")


@pytest.mark.slow
def test_live_default_model_json_schema_through_the_openai_client(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL, max_tokens=80, temperature=0,
                                       messages=[{"role": "user", "content": "Give the biggest city of Japan as JSON."}],
                                       response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=8, messages=HI,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
