"""The toy server (a live process on loopback) whose model writes scripted text on cue
(tests/server/scripted.py), read through the official openai client: a whole tool-call round trip,
the reasoning split, max_completion_tokens; and failures next to a request in flight, which must
end exactly as it would have alone."""

import json
import threading
import time

import httpx
import openai
import pytest

from tests.server.live import toy_chat_body
from tests.server.scripted import ANSWER, THINK_TRIGGER, THOUGHT, TOOL_REPLY_PREFIX, TOOL_TRIGGER, tool_calls_of

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]
ASK = [{"role": "user", "content": f"What is the weather in Paris? {TOOL_TRIGGER}"}]
EXPECTED_CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]


def stream_chat(client, **kw):
    """(content, reasoning, tool calls assembled from their deltas, finish reasons, chunks)."""
    chunks = list(client.chat.completions.create(model="toy", stream=True, stream_options={"include_usage": True}, **kw))
    content, reasoning, calls, finishes = [], [], {}, []
    for c in chunks:
        for choice in c.choices:
            d = choice.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            for call in d.tool_calls or []:
                acc = calls.setdefault(call.index, {"id": call.id, "name": call.function.name, "arguments": ""})
                acc["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return "".join(content), "".join(reasoning), [calls[k] for k in sorted(calls)], finishes, chunks


def test_tool_call_round_trip(toy_client):
    # turn 1: the model's <tool_call> blocks come back as tool_calls, not as text
    r = toy_client.chat.completions.create(model="toy", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert tool_calls_of(choice.message) == EXPECTED_CALLS
    ids = [c.id for c in choice.message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2

    content, _, calls, finishes, chunks = stream_chat(toy_client, messages=ASK, tools=TOOLS, max_tokens=200)
    assert finishes == ["tool_calls"] and content == "Let me check." and "<tool" not in content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == EXPECTED_CALLS
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens  # same script, same count, both ways

    # turn 2: the client sends the assistant's calls and one tool result back; the model reads the result
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": ids[0], "content": "sunny, 22 C"},
                     {"role": "tool", "tool_call_id": ids[1], "content": "14:05"}]
    r2 = toy_client.chat.completions.create(model="toy", messages=history, tools=TOOLS, max_tokens=200)
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.tool_calls is None
    reply = TOOL_REPLY_PREFIX + "get_weather: sunny, 22 C; get_time: 14:05"  # both calls and both results reached the model
    assert r2.choices[0].message.content == reply
    content2, _, calls2, finishes2, _ = stream_chat(toy_client, messages=history, tools=TOOLS, max_tokens=200)
    assert (content2, calls2, finishes2) == (reply, [], ["stop"])


def test_tool_choice_none_leaves_the_text_alone(toy_client):
    r = toy_client.chat.completions.create(model="toy", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=200)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.count("<tool_call>") == 2


def test_reasoning_split(toy_client):
    ask = [{"role": "user", "content": f"Greet me. {THINK_TRIGGER}"}]
    # the model opens <think> itself
    r = toy_client.chat.completions.create(model="toy", messages=ask, max_tokens=200)
    msg = r.choices[0].message
    assert (msg.content, msg.reasoning_content, r.choices[0].finish_reason) == (ANSWER, "\n" + THOUGHT, "stop")
    content, reasoning, _, finishes, _ = stream_chat(toy_client, messages=ask, max_tokens=200)
    assert (content, reasoning, finishes) == (ANSWER, "\n" + THOUGHT, ["stop"])
    # the template opens it (enable_thinking): the output starts inside the block
    on = {"chat_template_kwargs": {"enable_thinking": True}}
    r = toy_client.chat.completions.create(model="toy", messages=ask, max_tokens=200, extra_body=on)
    assert (r.choices[0].message.content, r.choices[0].message.reasoning_content) == (ANSWER, THOUGHT)
    content, reasoning, _, _, _ = stream_chat(toy_client, messages=ask, max_tokens=200, extra_body=on)
    assert (content, reasoning) == (ANSWER, THOUGHT)


def test_max_completion_tokens_cuts_inside_the_thinking(toy_client):
    ask = [{"role": "user", "content": f"Greet me. {THINK_TRIGGER}"}]
    for stream in (False, True):
        if stream:
            content, reasoning, _, finishes, chunks = stream_chat(toy_client, messages=ask, max_completion_tokens=12)
            usage = chunks[-1].usage
        else:
            r = toy_client.chat.completions.create(model="toy", messages=ask, max_completion_tokens=12)
            content, reasoning, finishes, usage = r.choices[0].message.content, r.choices[0].message.reasoning_content, \
                [r.choices[0].finish_reason], r.usage
        # one token per character: "<think>\n" and the first 4 characters of the thought, all of it reasoning
        assert finishes == ["length"] and usage.completion_tokens == 12
        assert reasoning == "\n" + THOUGHT[:4] and not content
    with pytest.raises(openai.BadRequestError, match="max_tokens and max_completion_tokens differ"):
        toy_client.chat.completions.create(model="toy", messages=ask, max_tokens=5, max_completion_tokens=12)


def test_bad_requests_next_to_a_stream_in_flight(toy, toy_client):
    """A stream runs while a malformed body, an invalid field and a request that fails inside the
    engine arrive (that one waits in the queue, then fails with 500): the stream's text, usage and
    finish are those of the same request alone."""
    body = dict(model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    alone = toy_client.chat.completions.create(**body)
    stream = iter(toy_client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body))
    first = next(stream)
    assert first.choices[0].delta.role == "assistant"
    failed = {}

    def failing():
        try:
            toy_client.completions.create(model="toy", prompt="boom", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        except openai.APIStatusError as e:
            failed["e"] = e

    t = threading.Thread(target=failing)
    t.start()
    assert httpx.post(toy.url + "/v1/chat/completions", content=b'{"messages": [').status_code == 400
    with pytest.raises(openai.BadRequestError, match="temperature"):
        toy_client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], temperature=5)
    with pytest.raises(openai.NotFoundError):
        toy_client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    rest = list(stream)
    t.join(30)
    text = "".join(c.choices[0].delta.content or "" for c in [first] + rest if c.choices)
    assert text == alone.choices[0].message.content and len(text) == 40
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
    assert rest[-1].usage == alone.usage
    assert failed["e"].status_code == 500 and "scripted failure" in failed["e"].message


def test_a_failure_in_flight_does_not_touch_the_request_queued_behind_it(toy, toy_client):
    """A stream that fails inside the engine two seconds in, with a good request waiting behind it:
    the failing one ends with an error event, the good one gets exactly its text alone."""
    good = toy_chat_body(40)
    alone = httpx.post(toy.url + "/v1/chat/completions", json=good, timeout=30).json()
    result, depths = {}, []
    with pytest.raises(openai.APIError, match="scripted failure") as e:
        for k, chunk in enumerate(toy_client.completions.create(model="toy", prompt="slowboom", max_tokens=100, temperature=0,
                                                                 stream=True, extra_body={"ignore_eos": True})):
            if k == 1:  # the failing request is generating (it fails at its 40th step): queue the good one behind it
                t = threading.Thread(target=lambda: result.update(r=httpx.post(toy.url + "/v1/chat/completions", json=good, timeout=30)))
                t.start()
                until = time.monotonic() + 1.5
                while time.monotonic() < until:
                    depths.append(httpx.get(toy.url + "/health").json()["queue_depth"])
                    if depths[-1] == 1:
                        break
    assert depths[-1] == 1, depths  # the good request did wait behind the failing one
    assert not isinstance(e.value, openai.APIStatusError)  # the 200 had gone out: an error event
    t.join(30)
    assert result["r"].status_code == 200
    reply = result["r"].json()
    assert reply["choices"] == alone["choices"] and reply["usage"] == alone["usage"]
