"""The grammar of a forced tool_choice (server/tool_choice.py), with llguidance's matcher over the
ASCII tokenizer as the judge of what it lets through, and server/tools.py + jsonschema as the oracle
of what the server reads back: in both forms, every text the grammar accepts parses into calls of
allowed tools whose arguments validate; unknown names, missing required or undeclared parameters,
out-of-range values, a second call under max_calls=1, text before the call and values that would
end the block early are refused; the reasoning block in its three modes; tags that are special
tokens matched as those tokens only. Then the 400s on each route (no tools, an unknown name, a
structured-output field beside the choice, choice objects that are not offered)."""

from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest

from tests.server.scripted import AsciiTokenizer
from tests.server.stub_app import KEY, stub_client
from treeflash.engine.grammar import GrammarCompiler, grammar_text
from treeflash.server.errors import APIError
from treeflash.server.tool_choice import CallFormat, ForcedChoice, think_mode, tool_call_grammar
from treeflash.server.tools import parse_tool_calls

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "options": {"type": "object", "properties": {"unit": {"$ref": "#/$defs/unit"}}, "additionalProperties": False},
    "hourly": {"type": "boolean"}, "mode": {"type": "string", "enum": ["fast", "slow"]}},
    "required": ["city"], "$defs": {"unit": {"type": "string", "enum": ["c", "f"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASCII = GrammarCompiler(AsciiTokenizer(), 97, [96])


def accepts(grammar, text: str, compiler: GrammarCompiler = ASCII, ids: list[int] | None = None) -> bool:
    """Whether the matcher takes the whole text (as these token ids) and may end there."""
    matcher = llguidance.LLMatcher(compiler.tokenizer(), grammar_text(grammar), log_level=0)
    ids = AsciiTokenizer()(text)["input_ids"] if ids is None else ids
    if matcher.validate_tokens(ids) != len(ids):
        return False
    assert matcher.consume_tokens(ids)
    return matcher.is_accepting()


def grammar(form: str, name: str | None = None, max_calls: int | None = None, think: str = "none", special=frozenset()):
    g = tool_call_grammar(ForcedChoice(name), TOOLS, CallFormat(form, frozenset(special), think), max_calls)
    ASCII.check(g)  # llguidance compiles it
    return g


def json_call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def xml_call(name: str, params: list[tuple[str, str]]) -> str:
    body = "".join(f"<parameter={p}>\n{v}\n</parameter>\n" for p, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def assert_valid_calls(text: str, form: str, allowed: set[str]) -> None:
    content, calls = parse_tool_calls(text, form, TOOLS)
    assert content == "" and calls, text
    for c in calls:
        assert c.name in allowed
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


GOOD = {
    "json": [json_call("get_weather", {"city": "Paris", "days": 3}),
             json_call("get_weather", {"city": "", "options": {"unit": "f"}, "hourly": False, "mode": "slow"}),
             json_call("get_time", {}) + "\n" + json_call("get_weather", {"city": "Oslo"})],
    "xml": [xml_call("get_weather", [("city", "Paris"), ("days", "3")]),
            xml_call("get_weather", [("city", "a\n<b> &"), ("options", '{"unit": "c"}'), ("hourly", "True"), ("mode", "fast")]),
            xml_call("get_time", []) + "\n" + xml_call("get_weather", [("city", "\nOslo\n")])],
}
BAD = {
    "json": [json_call("get_weathr", {"city": "Paris"}),  # not a tool
             json_call("get_weather", {"days": 3}),  # city is required
             json_call("get_weather", {"city": "Paris", "days": 10}),  # over the maximum
             json_call("get_weather", {"city": "Paris", "extra": 1}),  # not declared
             json_call("get_weather", {"city": "Paris", "options": {"unit": "k"}}),  # $ref'd enum
             json_call("get_weather", {"city": "Amsterdam"}),  # over maxLength
             "Sure. " + json_call("get_time", {}),  # text before the call
             '<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>'],  # not the template's layout
    "xml": [xml_call("get_weathr", [("city", "Paris")]),
            xml_call("get_weather", [("days", "3")]),
            xml_call("get_weather", [("city", "Paris"), ("days", "10")]),
            xml_call("get_weather", [("city", "Paris"), ("extra", "1")]),
            xml_call("get_weather", [("days", "3"), ("city", "Paris")]),  # out of the schema's order
            xml_call("get_weather", [("city", "Paris"), ("options", '{"unit": "k"}')]),
            xml_call("get_weather", [("city", "Paris"), ("hourly", "yes")]),
            xml_call("get_weather", [("city", "Paris"), ("mode", "medium")]),
            xml_call("get_weather", [("city", "Amsterdam")]),
            xml_call("get_weather", [("city", "P</tool_call>")]),  # would end the block early
            "Sure. " + xml_call("get_time", [])],
}


@pytest.mark.parametrize("form", ["json", "xml"])
def test_accepted_texts_parse_into_valid_calls_and_bad_ones_are_refused(form):
    g = grammar(form)
    for text in GOOD[form]:
        assert accepts(g, text), text
        assert_valid_calls(text, form, {"get_weather", "get_time"})
    for text in BAD[form]:
        assert not accepts(g, text), text


@pytest.mark.parametrize("form", ["json", "xml"])
def test_a_named_choice_and_one_call(form):
    call = GOOD[form][0]
    assert accepts(grammar(form, "get_weather"), call) and not accepts(grammar(form, "get_time"), call)
    two = GOOD[form][2]
    assert accepts(grammar(form), two) and not accepts(grammar(form, max_calls=1), two)
    assert accepts(grammar(form, max_calls=1), call)


def test_the_reasoning_block_in_its_three_modes():
    call = GOOD["json"][0]
    thought = "<think>\nweather: call it </thin\n</think>\n\n"
    assert accepts(grammar("json", think="optional"), call) and accepts(grammar("json", think="optional"), thought + call)
    assert not accepts(grammar("json"), thought + call)
    opened = grammar("json", think="open")  # the prompt opened <think>: the output starts inside it
    assert accepts(opened, "weather.\n</think>\n\n" + call) and accepts(opened, "</think>" + call)
    assert not accepts(opened, call)  # a call with no </think> is still thought
    assert not accepts(opened, "x</think>\n\nSure. " + call)
    assert think_mode(None, "<|im_start|>assistant\n") == "none"
    assert think_mode("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n") == "open"
    assert think_mode("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n\n</think>\n\n") == "none"  # thinking off
    assert think_mode("{{ '<think>' }}", "<|im_start|>assistant\n") == "optional"


def byte_tokenizer():
    """A byte-level BPE with no merges (one token per byte) and the tags as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from treeflash.engine.token_bytes import gpt2_byte_decoder

    table = gpt2_byte_decoder()
    tok = Tokenizer(models.BPE(vocab={c: b for c, b in table.items()}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    hf.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>", "<think>", "</think>"]})
    return hf


def test_tags_that_are_special_tokens_match_only_as_those_tokens():
    hf = byte_tokenizer()
    compiler = GrammarCompiler(hf, len(hf), [hf.eos_token_id])
    special = {"<tool_call>", "</tool_call>", "<think>", "</think>"}
    text = "<think>hm</think>\n" + GOOD["json"][0]
    g = tool_call_grammar(ForcedChoice(), TOOLS, CallFormat("json", frozenset(special), "optional"))
    as_tokens = hf(text, add_special_tokens=False)["input_ids"]
    spelled = hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert len(spelled) > len(as_tokens)
    assert accepts(g, text, compiler, as_tokens) and not accepts(g, text, compiler, spelled)


def test_names_the_xml_form_cannot_write_are_400s():
    tools = [{"type": "function", "function": {"name": "a>b", "parameters": {"type": "object"}}}]
    with pytest.raises(APIError) as e:
        tool_call_grammar(ForcedChoice(), tools, CallFormat("xml"))
    assert e.value.param == "tools"
    tool_call_grammar(ForcedChoice(), tools, CallFormat("json"))  # any name is a JSON string


def test_a_schema_without_properties_takes_any_parameter_in_xml():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    g = tool_call_grammar(ForcedChoice(), tools, CallFormat("xml"))
    assert accepts(g, xml_call("f", [("x", "1"), ("y z", "free\ntext")])) and accepts(g, xml_call("f", []))
    assert not accepts(g, xml_call("f", [("x", "a</parameter>b")]))


# -- the 400s, on each route (the stub engine: no model needed) --

HI = [{"role": "user", "content": "hi"}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
FLAT_TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
ANTHROPIC_TOOLS = [{"name": "f", "input_schema": {"type": "object"}}]
SCHEMA = {"type": "object"}
CASES = [  # (name, path, body, param, words the message must contain)
    ("chat no tools", "/v1/chat/completions", {"messages": HI, "tool_choice": "required"}, "tool_choice", ["no tools"]),
    ("chat unknown name", "/v1/chat/completions", {"messages": HI, "tools": CHAT_TOOLS,
     "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice.function.name", ["'g'"]),
    ("chat with response_format", "/v1/chat/completions", {"messages": HI, "tools": CHAT_TOOLS, "tool_choice": "required",
     "response_format": {"type": "json_object"}}, "tool_choice", ["tool_choice", "response_format"]),
    ("chat with guided_regex", "/v1/chat/completions", {"messages": HI, "tools": CHAT_TOOLS, "guided_regex": "a",
     "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", ["tool_choice", "guided_regex"]),
    ("responses no tools", "/v1/responses", {"input": "hi", "tool_choice": "required"}, "tool_choice", ["no tools"]),
    ("responses unknown name", "/v1/responses", {"input": "hi", "tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "g"}},
     "tool_choice.name", ["'g'"]),
    ("responses with text.format", "/v1/responses", {"input": "hi", "tools": FLAT_TOOLS, "tool_choice": "required",
     "text": {"format": {"type": "json_object"}}}, "tool_choice", ["tool_choice", "text.format"]),
    ("responses allowed_tools", "/v1/responses", {"input": "hi", "tools": FLAT_TOOLS,
     "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}}, "tool_choice.type", ["allowed_tools"]),
    ("responses function without name", "/v1/responses", {"input": "hi", "tools": FLAT_TOOLS, "tool_choice": {"type": "function"}},
     "tool_choice.name", ["name"]),
]
ANTHROPIC_CASES = [  # (name, body, words)
    ("messages no tools", {"tool_choice": {"type": "any"}}, ["no tools"]),
    ("messages unknown name", {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "g"}}, ["tool_choice.name", "'g'"]),
    ("messages tool without name", {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool"}}, ["tool_choice.name"]),
    ("messages with output_config.format", {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"},
     "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, ["tool_choice", "output_config.format"]),
]


@pytest.fixture(scope="module")
def app():
    with stub_client() as tc:
        yield tc


@pytest.mark.parametrize("name,path,body,param,words", CASES, ids=[c[0] for c in CASES])
def test_openai_routes_refuse_a_choice_they_cannot_honour(app, name, path, body, param, words):
    r = app.post(path, json={"model": "toy", **body}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param and all(w in err["message"] for w in words), err


@pytest.mark.parametrize("name,body,words", ANTHROPIC_CASES, ids=[c[0] for c in ANTHROPIC_CASES])
def test_messages_refuses_a_choice_it_cannot_honour(app, name, body, words):
    r = app.post("/v1/messages", json={"model": "toy", "max_tokens": 8, "messages": HI, **body}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and all(w in err["message"] for w in words), err


def test_a_tool_schema_llguidance_cannot_compile_is_a_400_naming_tools(app):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"not": {"type": "string"}}}}}}]
    r = app.post("/v1/chat/completions", json={"model": "toy", "messages": HI, "tools": tools, "tool_choice": "required"},
                 headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text[:300]
