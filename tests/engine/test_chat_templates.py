"""The real Qwen chat templates render byte-for-byte as transformers' apply_chat_template renders
them (its render_jinja_template, tokenizer-free): 36 conversations x 4 template families (Qwen2.5,
Qwen3, Qwen3.5/3.6, Qwen3-Coder; fixtures in tests/engine/templates, SOURCES.md says where each
comes from) with system prompts, multi-turn, tools, tool calls and responses, reasoning_content
round-trips, enable_thinking on / off / unset, with and without the generation prompt. A template
that raises for a conversation raises for both (ours as InvalidRequestError). Plus the sandbox
features those templates and others use: loop controls, tojson options, {% generation %}."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from treeflash.engine.chat import render_chat
from treeflash.errors import InvalidRequestError

TEMPLATES = {p.stem: p.read_text() for p in sorted((Path(__file__).parent / "templates").glob("*.jinja"))}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.\n",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Forecast days", "minimum": 1},
        "units": {"type": "string", "enum": ["c", "f"]},
        "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}}, "x-extra": {"a": 1}},
    }, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
                   "required": ["query", "tags"]}}}
TOOLS = [WEATHER, SEARCH]

SYS = {"role": "system", "content": "You are terse. Ünïcode: 日本語 \"quotes\" <tags> & ampersands."}
U1 = {"role": "user", "content": "What's the weather in Paris?"}
U2 = {"role": "user", "content": "And tomorrow, in °F?"}
A1 = {"role": "assistant", "content": "Sunny, 21 °C."}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "options": {"hourly": True}}}}]}
CALL_WITH_TEXT = {"role": "assistant", "content": "Let me check.", "tool_calls": CALL["tool_calls"]}
TWO_CALLS = {"role": "assistant", "content": "", "tool_calls": CALL["tool_calls"] + [
    {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": {"query": "paris \"events\"", "tags": ["a", "b"]}}}]}
TOOL1 = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
TOOL2 = {"role": "tool", "tool_call_id": "call_2", "content": "3 results\nline two"}
THOUGHT = {"role": "assistant", "content": "It is sunny.", "reasoning_content": "The user wants weather.\nI know it."}
INLINE_THOUGHT = {"role": "assistant", "content": "<think>\nInline reasoning.\n</think>\n\nIt is sunny."}
THOUGHT_CALL = {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": CALL["tool_calls"]}

CONVERSATIONS = {  # name: (messages, tools)
    "user": ([U1], None),
    "system-user": ([SYS, U1], None),
    "multi-turn": ([U1, A1, U2], None),
    "system-multi-turn": ([SYS, U1, A1, U2], None),
    "ends-with-assistant": ([U1, A1], None),
    "tools-user": ([U1], TOOLS),
    "tools-system-user": ([SYS, U1], TOOLS),
    "tool-call": ([U1, CALL], TOOLS),
    "tool-call-response": ([U1, CALL, TOOL1], TOOLS),
    "tool-call-response-answer": ([U1, CALL, TOOL1, A1], TOOLS),
    "tool-call-with-text": ([SYS, U1, CALL_WITH_TEXT, TOOL1], TOOLS),
    "parallel-calls": ([U1, TWO_CALLS, TOOL1, TOOL2], TOOLS),
    "parallel-calls-answer-next-turn": ([U1, TWO_CALLS, TOOL1, TOOL2, A1, U2], TOOLS),
    "reasoning-content-last": ([U1, THOUGHT], None),
    "reasoning-content-history": ([U1, THOUGHT, U2], None),
    "inline-think-history": ([U1, INLINE_THOUGHT, U2], None),
    "inline-think-last": ([SYS, U1, INLINE_THOUGHT], None),
    "reasoning-tool-call": ([U1, THOUGHT_CALL, TOOL1], TOOLS),
    "reasoning-tool-call-answer": ([U1, THOUGHT_CALL, TOOL1, THOUGHT, U2], TOOLS),
    "empty-system": ([{"role": "system", "content": ""}, U1], None),
    "empty-system-tools": ([{"role": "system", "content": ""}, U1], TOOLS),
    "one-tool": ([U1], [SEARCH]),
    "long-history": ([SYS] + [U1, A1, U2, A1] * 3 + [U2], None),
    "tool-response-as-user-text": ([U1, CALL, {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}], TOOLS),
    "newlines-and-spaces": ([{"role": "user", "content": "  padded \n\n text  "}], None),
    "json-in-user": ([{"role": "user", "content": "{\"a\": [1, 2, {\"b\": null}]}"}], None),
    "no-user": ([SYS], None),  # Qwen3.5 raises: no user query
    "system-not-first": ([U1, SYS], None),  # Qwen3.5 raises
    "tool-first": ([TOOL1, U1], TOOLS),
    "string-content-call-args": ([U1, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "search", "arguments": {"query": "x", "tags": []}}}]}], TOOLS),
    "numbers-and-bools-args": ([U1, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3.5, "units": None}}}]}], TOOLS),
    "unicode-args": ([U1, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich 東京"}}}]}], TOOLS),
    "three-turn-tools": ([SYS, U1, CALL, TOOL1, A1, U2, TWO_CALLS, TOOL1, TOOL2], TOOLS),
    "assistant-prefill": ([U1, {"role": "assistant", "content": "Sure"}], None),
    "reasoning-empty-string": ([U1, {"role": "assistant", "content": "Hi.", "reasoning_content": ""}, U2], None),
    "tool-no-tools-given": ([U1, CALL, TOOL1], None),
}
THINKING = {"unset": {}, "on": {"enable_thinking": True}, "off": {"enable_thinking": False}}


def transformers_render(template, messages, tools, add_generation_prompt, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **kwargs)
    return rendered[0]


def both(template, messages, tools, gen, kwargs):
    """(theirs, ours), or the error each raised."""
    from jinja2 import TemplateError

    try:
        theirs = transformers_render(template, copy.deepcopy(messages), copy.deepcopy(tools), gen, **kwargs)
    except (TemplateError, TypeError, AttributeError, KeyError, IndexError) as e:
        theirs = e
    try:
        ours = render_chat(template, copy.deepcopy(messages), add_generation_prompt=gen, tools=copy.deepcopy(tools), **kwargs)
    except InvalidRequestError as e:
        ours = e
    return theirs, ours


def test_at_least_30_conversations_and_4_families():
    assert len(CONVERSATIONS) >= 30 and set(TEMPLATES) == {"qwen2_5", "qwen3", "qwen3_5", "qwen3_coder"}


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_renders_as_transformers(family, name):
    messages, tools = CONVERSATIONS[name]
    rendered = 0
    for gen in (True, False):
        for thinking in THINKING.values():
            theirs, ours = both(TEMPLATES[family], messages, tools, gen, thinking)
            if isinstance(theirs, Exception):
                assert isinstance(ours, InvalidRequestError), f"transformers raised {theirs!r}, we rendered"
                continue
            assert not isinstance(ours, Exception), f"transformers rendered, we raised {ours}"
            assert ours == theirs
            rendered += 1
    if name not in ("no-user", "system-not-first", "tool-first") or family != "qwen3_5":
        assert rendered > 0  # the comparison ran


def test_the_families_differ_where_they_should():
    """Guards against a vacuous pass: the fixtures really are four templates that disagree."""
    messages, tools = CONVERSATIONS["reasoning-tool-call"]
    outs = {f: render_chat(t, copy.deepcopy(messages), tools=copy.deepcopy(tools)) for f, t in TEMPLATES.items()}
    assert len(set(outs.values())) == 4
    assert "<function=get_weather>" in outs["qwen3_5"] and "<function=get_weather>" in outs["qwen3_coder"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris"' in outs["qwen3"]
    on = render_chat(TEMPLATES["qwen3_5"], [U1], enable_thinking=True)
    off = render_chat(TEMPLATES["qwen3_5"], [U1], enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n<think>\n") and off.endswith("<think>\n\n</think>\n\n")


SANDBOX = {
    "break": ("{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}{{ m.content }};{% endfor %}", {}),
    "continue": ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }};{% endfor %}", {}),
    "tojson-separators": ("{{ tools | tojson(separators=(',', ':')) }}", {}),
    "tojson-indent-sort": ("{{ tools | tojson(indent=2, sort_keys=True) }}", {}),
    "tojson-ascii": ("{{ messages | tojson(ensure_ascii=True) }}", {}),
    "tojson-no-html-escape": ("{{ '<a & b>' | tojson }}", {}),
    "generation": ("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}", {}),
    "namespace-items": ("{% set ns = namespace(n=0) %}{% for k, v in {'a': 1, 'b': 2}|items %}{% set ns.n = ns.n + v %}{% endfor %}{{ ns.n }}", {}),
    "strftime-global": ("{{ strftime_now('%Y') | length }}", {}),
    "kwargs": ("{{ custom_flag }}|{{ bos_token }}", {"custom_flag": "yes", "bos_token": "<s>"}),
}


@pytest.mark.parametrize("case", list(SANDBOX))
def test_sandbox_features_as_transformers(case):
    template, kwargs = SANDBOX[case]
    messages = [SYS, U1, A1, U2]
    theirs, ours = both(template, messages, TOOLS, True, kwargs)
    assert not isinstance(theirs, Exception) and ours == theirs


def test_raise_exception_and_sandbox_escape_are_request_errors():
    with pytest.raises(InvalidRequestError, match="nope"):
        render_chat("{{ raise_exception('nope') }}", [U1])
    with pytest.raises(InvalidRequestError):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [U1])
