"""Tool-call parsing in both forms (server/tools.py, server/tool_xml.py): the XML (qwen3_coder) form
with values typed by the tool's JSON schema, the JSON (Hermes) form, the form read off the real
chat templates, every split of the stream into two pieces (and one character at a time) giving the
same content and calls, nested JSON, several calls in a turn, parallel_tool_calls, malformed input."""

import json
from pathlib import Path

import pytest

from treeflash.errors import InvalidRequestError
from treeflash.server.tool_xml import convert
from treeflash.server.tools import ToolCallParser, parse_tool_calls, tool_call_form

TEMPLATES = Path(__file__).parents[1] / "engine" / "templates"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"}, "hourly": {"type": "boolean"},
        "options": {"type": "object"}, "tags": {"type": "array"}, "zip": {"type": "string"}, "maybe": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}},
]
XML_TWO = (
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, <France> & co\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=temp>\n21.5\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n"
    "<parameter=options>\n{\"units\": {\"t\": \"c\", \"levels\": [1, [2, {\"deep\": null}]]}}\n</parameter>\n"
    "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=run>\n<parameter=code>\ndef f():\n    return {\"x\": 1}\n\n</parameter>\n"
    "</function>\n</tool_call>"
)
XML_TWO_CALLS = [
    ("get_weather", {"city": "Paris, <France> & co", "days": 3, "temp": 21.5, "hourly": True,
                     "options": {"units": {"t": "c", "levels": [1, [2, {"deep": None}]]}}, "tags": ["a", "b"], "zip": "01234", "maybe": None}),
    ("run", {"code": "def f():\n    return {\"x\": 1}\n"}),
]
JSON_TWO = (
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"options\": {\"a\": [1, {\"b\": \"}\"}]}}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"run\", \"arguments\": {\"code\": \"print('</tool')\"}}\n</tool_call>\n"
)
JSON_TWO_CALLS = [("get_weather", {"city": "Paris", "options": {"a": [1, {"b": "}"}]}}), ("run", {"code": "print('</tool')"})]
MALFORMED = {  # form: texts whose blocks are not calls in that form (each stays content, whole)
    "xml": [
        "a <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call> b",  # no </function>
        "<tool_call>\n<function=f>\njunk outside a parameter\n</function>\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",  # the JSON form, to the XML parser
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=x>\nunclosed",  # cut off inside a parameter
    ],
    "json": [
        "a <tool_call>{bad json}</tool_call> b",
        "<tool_call>\n<function=f>\n</function>\n</tool_call>",  # the XML form, to the JSON parser
        "<tool_call>{\"arguments\": {}}</tool_call>",  # no name
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {",
    ],
}


def run_pieces(form, text, pieces, tools=TOOLS, max_calls=None):
    p = ToolCallParser(form, tools, max_calls)
    content, calls = [], []
    for piece in pieces:
        c, k = p.feed(piece)
        content.append(c)
        calls += k
    c, k = p.flush()
    return "".join(content) + c, [(x.name, json.loads(x.arguments)) for x in calls + k], p


def all_splits(text):
    """Every cut into two pieces, and one character at a time."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)


@pytest.mark.parametrize("form,text,expected", [("xml", XML_TWO, XML_TWO_CALLS), ("json", JSON_TWO, JSON_TWO_CALLS)])
def test_two_calls_at_every_split(form, text, expected):
    for pieces in all_splits(text):
        content, calls, _ = run_pieces(form, text, pieces)
        assert content == "Let me check." and calls == expected, pieces


@pytest.mark.parametrize("form", ["xml", "json"])
def test_malformed_blocks_stay_content_at_every_split(form):
    for text in MALFORMED[form]:
        whole, calls, p = run_pieces(form, text, [text])
        assert calls == [] and p.malformed == 1
        assert whole.replace(" ", "") == text.replace(" ", "")  # nothing lost (only layout spaces around tags)
        for pieces in all_splits(text):
            assert run_pieces(form, text, pieces)[:2] == (whole, []), pieces


def test_a_call_cut_off_at_its_closing_tag_is_recovered():
    """max_tokens (or a stop) may end the stream right before </tool_call>: the block is still a call."""
    text = "<tool_call>\n<function=run>\n<parameter=code>\nx = 1\n</parameter>\n</function>\n"
    assert run_pieces("xml", text, [text])[:2] == ("", [("run", {"code": "x = 1"})])


def test_calls_between_content_and_plain_text_kept():
    text = "Intro <b>bold</b> x<y.\n<tool_call>\n<function=run>\n<parameter=code>\n1\n</parameter>\n</function>\n</tool_call>\nTail text."
    for pieces in all_splits(text):
        content, calls, _ = run_pieces("xml", text, pieces)
        assert content == "Intro <b>bold</b> x<y.\nTail text." and calls == [("run", {"code": "1"})]


def test_parallel_tool_calls_false_keeps_the_first_call():
    for form, text, expected in (("xml", XML_TWO, XML_TWO_CALLS), ("json", JSON_TWO, JSON_TWO_CALLS)):
        for pieces in ([text], list(text)):
            content, calls, p = run_pieces(form, text, pieces, max_calls=1)
            assert content == "Let me check." and calls == expected[:1] and p.dropped == 1


@pytest.mark.parametrize("value,type_name,expected", [
    ("123", "string", "123"), (" 7 ", "integer", 7), ("7.0", "integer", "7.0"), ("x", "integer", "x"),
    ("2", "number", 2), ("2.5", "number", 2.5), ("1e3", "number", 1000.0), ("TRUE", "boolean", True), ("false", "bool", False),
    ("yes", "boolean", "yes"), ("null", "object", None), ("null", "string", "null"), ('{"a": {"b": [1]}}', "object", {"a": {"b": [1]}}),
    ("[1, 2]", "array", [1, 2]), ("not json", "object", "not json"), ("__import__('os')", "object", "__import__('os')"),
    ("5", None, "5"),
])
def test_values_by_schema_type(value, type_name, expected):
    assert convert(value, type_name) == expected


def test_unknown_function_and_parameters_stay_strings():
    text = "<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"
    content, calls = parse_tool_calls(text, "xml", TOOLS)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("other", {"n": "5"})]
    _, calls = parse_tool_calls(text, "xml", None)  # no schemas at all
    assert json.loads(calls[0].arguments) == {"n": "5"}


def test_form_from_the_real_templates_and_the_flag():
    forms = {p.stem: tool_call_form(p.read_text()) for p in TEMPLATES.glob("*.jinja")}
    assert forms == {"qwen2_5": "json", "qwen3": "json", "qwen3_5": "xml", "qwen3_coder": "xml"}
    assert tool_call_form(None) == "json"
    assert tool_call_form((TEMPLATES / "qwen3_5.jinja").read_text(), "json") == "json"
    assert tool_call_form(None, "xml") == "xml"
    with pytest.raises(InvalidRequestError, match="--tool-call-parser must be one of auto, json, xml"):
        tool_call_form(None, "hermes")


def test_default_parser_is_the_json_form():
    """Compatible with the original interface: ToolCallParser() and parse_tool_calls(text)."""
    content, calls = parse_tool_calls(JSON_TWO)
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in calls] == JSON_TWO_CALLS
    assert ToolCallParser().form == "json"
