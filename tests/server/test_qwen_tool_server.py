"""The server with a Qwen3.5-style model (the real Qwen3.5 chat template, a scripted engine that
writes XML tool calls a few characters per event): the openai client gets tool_calls, streamed
and not, with values typed by the tool schema; --tool-call-parser overrides the template's form;
parallel_tool_calls=false keeps one call; a malformed call comes back as content with finish
"stop"; --no-think / --chat-template-kwargs are defaults each request may override."""

import json
from pathlib import Path

import pytest

from tests.server.scripted import StubEngine, _Loaded
from tests.server.test_cli_serve import parse, served
from treeflash.cli.serve import server_config
from treeflash.errors import InvalidRequestError

MODEL = "SmolLM2-135M-Instruct"  # the served name without --model
QWEN35 = (Path(__file__).parents[1] / "engine" / "templates" / "qwen3_5.jinja").read_text()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "options": {"type": "object"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
XML_OUTPUT = (
    "I will look it up.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "<parameter=options>\n{\"units\": \"c\", \"hours\": [6, 12]}\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Paris\n</parameter>\n</function>\n</tool_call>"
)
CALLS = [("get_weather", {"city": "Paris", "days": 3, "options": {"units": "c", "hours": [6, 12]}}), ("get_time", {"tz": "Europe/Paris"})]


THINK = "The user wants the weather.\n</think>\n\n"  # the template opened <think>: the model closes it


class QwenStub(StubEngine):
    """The stub with Qwen3.5's template; records each prompt it was given. Its output starts with
    the end of a thought (thinking is on by default), unless `think` is False."""

    def __init__(self, text, think=True):
        super().__init__(max_context=8192, default_text=(THINK if think else "") + text)
        self.loaded = _Loaded(QWEN35)
        self.prompts = []

    def stream(self, req, cancelled=None):
        self.prompts.append(self.tokenizer.decode(list(req.prompt_ids)))
        yield from super().stream(req, cancelled)


def stream_chat(client, **kw):
    """(content, [(name, arguments)] assembled from the tool_call deltas, finish reasons)."""
    content, calls, finishes = [], {}, []
    for c in client.chat.completions.create(model=MODEL, stream=True, **kw):
        for choice in c.choices:
            content.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                acc = calls.setdefault(call.index, [call.function.name, ""])
                acc[1] += call.function.arguments or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return "".join(content), [(n, json.loads(a)) for n, a in (calls[k] for k in sorted(calls))], finishes


def calls_of(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_xml_tool_calls_reach_the_openai_client():
    engine = QwenStub(XML_OUTPUT)
    with served(engine=engine) as (client, _, _):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=500)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "I will look it up."
        assert calls_of(choice.message) == CALLS
        content, calls, finishes = stream_chat(client, messages=ASK, tools=TOOLS, max_tokens=500)
        assert finishes == ["tool_calls"] and content == "I will look it up." and calls == CALLS
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=500, parallel_tool_calls=False)
        assert calls_of(r.choices[0].message) == CALLS[:1] and r.choices[0].finish_reason == "tool_calls"
    assert "<function=example_function_name>" in engine.prompts[0] and "\"get_weather\"" in engine.prompts[0]


def test_the_flag_overrides_the_template_form():
    with served("--tool-call-parser", "json", engine=QwenStub(XML_OUTPUT)) as (client, _, _):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=500)
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content.count("<function=") == 2  # not JSON: given back as text, whole


def test_a_malformed_call_is_content_not_an_error():
    broken = "Trying.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"  # no </function>
    with served(engine=QwenStub(broken)) as (client, _, _):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=500)
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
        assert "<parameter=city>" in r.choices[0].message.content
        content, calls, finishes = stream_chat(client, messages=ASK, tools=TOOLS, max_tokens=500)
        assert finishes == ["stop"] and calls == [] and content == r.choices[0].message.content


def test_no_think_is_a_default_the_request_overrides():
    engine = QwenStub("Hello.", think=False)
    with served("--no-think", engine=engine) as (client, _, _):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10)
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert engine.prompts[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.prompts[1].endswith("<|im_start|>assistant\n<think>\n")


def test_thinking_output_splits_into_reasoning_content():
    engine = QwenStub("It is sunny.")
    with served(engine=engine) as (client, _, _):
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=100)
        msg = r.choices[0].message
        assert msg.content == "It is sunny." and msg.model_extra["reasoning_content"] == "The user wants the weather.\n"


def test_bad_template_flags_are_cli_errors():
    assert server_config(parse("--chat-template-kwargs", '{"enable_thinking": false, "x": 1}')).chat_template_kwargs == {"enable_thinking": False, "x": 1}
    assert server_config(parse("--no-think", "--chat-template-kwargs", '{"x": 1}')).chat_template_kwargs == {"x": 1, "enable_thinking": False}
    for value, match in (("{bad", "not valid JSON"), ("[1]", "must be a JSON object"), ('{"messages": []}', "may not set 'messages'")):
        with pytest.raises(InvalidRequestError, match=match):
            server_config(parse("--chat-template-kwargs", value))
    with pytest.raises(SystemExit):
        parse("--tool-call-parser", "hermes")
