"""POST /v1/messages through Anthropic's own client, in-process over the scripted stub engine: text,
streaming equal to the non-streaming reply, a tool round trip, thinking blocks, count_tokens, both
API-key headers, and bad requests answered in Anthropic's error envelope while the app keeps serving."""

import anthropic
import pytest

from tests.server.scripted import ANSWER, THINK_TRIGGER, THOUGHT, TOOL_REPLY_PREFIX, TOOL_TRIGGER
from tests.server.stub_app import KEY, stub_client
from treeflash.engine.request import Usage
from treeflash.engine.stops import StopMatcher
from treeflash.server.anthropic.events import stop_reason
from treeflash.server.output import Finish

TOOLS = [{"name": "get_weather", "description": "Current weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def app():
    with stub_client() as tc:
        yield tc


@pytest.fixture(scope="module")
def client(app):
    return anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=app, max_retries=0)


def blocks(message) -> list[dict]:
    """The content blocks as plain dicts (the stream helper's classes differ from create()'s)."""
    return [{k: v for k, v in b.model_dump().items() if k in ("type", "text", "thinking", "name", "input")} for b in message.content]


def test_text_reply_and_usage(client):
    m = client.messages.create(model="toy", max_tokens=64, messages=HI, system="Be brief.")
    assert m.type == "message" and m.role == "assistant" and m.model == "toy" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "plain words from a stub"
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens == len("plain words from a stub") and m.usage.input_tokens > 0
    counted = client.messages.count_tokens(model="toy", messages=HI, system="Be brief.")
    assert counted.input_tokens == m.usage.input_tokens  # the same rendering, the same count


def test_max_tokens_cut_is_max_tokens(client):
    m = client.messages.create(model="toy", max_tokens=7, messages=HI)
    assert m.stop_reason == "max_tokens" and m.content[0].text == "plain w" and m.usage.output_tokens == 7


def test_stream_folds_to_the_same_message(client):
    whole = client.messages.create(model="toy", max_tokens=64, messages=HI)
    with client.messages.stream(model="toy", max_tokens=64, messages=HI) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert blocks(final) == blocks(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_raw_stream_has_named_events_and_a_ping(app):
    with app.stream("POST", "/v1/messages", json={"model": "toy", "max_tokens": 8, "messages": HI, "stream": True},
                    headers={"x-api-key": KEY}) as r:
        body = r.read().decode()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    names = [line.removeprefix("event: ") for line in body.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    assert "[DONE]" not in body


def test_tool_round_trip(client):
    ask = [{"role": "user", "content": f"What is the weather in Paris? {TOOL_TRIGGER}"}]
    m = client.messages.create(model="toy", max_tokens=300, messages=ask, tools=TOOLS)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"] and m.content[0].text == "Let me check."
    calls = [(b.name, b.input) for b in m.content[1:]]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]
    assert all(b.id.startswith("toolu_") for b in m.content[1:])
    # turn 2: the assistant's tool_use blocks and the user's tool_result blocks reach the model
    results = [{"type": "tool_result", "tool_use_id": m.content[1].id, "content": "sunny"},
               {"type": "tool_result", "tool_use_id": m.content[2].id, "content": [{"type": "text", "text": "noon"}]}]
    history = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                     {"role": "user", "content": results}]
    reply = client.messages.create(model="toy", max_tokens=300, messages=history, tools=TOOLS)
    assert reply.content[0].text == TOOL_REPLY_PREFIX + "get_weather: sunny; get_time: noon"
    assert reply.stop_reason == "end_turn"
    # streamed: input_json_delta assembles to the same inputs
    with client.messages.stream(model="toy", max_tokens=300, messages=ask, tools=TOOLS) as s:
        streamed = s.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == calls


def test_tool_choice_none_leaves_the_text_alone(client):
    m = client.messages.create(model="toy", max_tokens=300, messages=[{"role": "user", "content": TOOL_TRIGGER}], tools=TOOLS,
                               tool_choice={"type": "none"})
    assert [b.type for b in m.content] == ["text"] and "<tool_call>" in m.content[0].text


def test_thinking_blocks(client):
    ask = [{"role": "user", "content": f"Greet me. {THINK_TRIGGER}"}]
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        # enabled: the template opens <think> and the model writes the rest; disabled: the model opens it itself
        m = client.messages.create(model="toy", max_tokens=300, messages=ask, thinking=thinking)
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking.strip() == THOUGHT.strip() and m.content[1].text == ANSWER
        with client.messages.stream(model="toy", max_tokens=300, messages=ask, thinking=thinking) as s:
            deltas = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
            assert blocks(s.get_final_message()) == blocks(m)
        assert "thinking_delta" in deltas and "signature_delta" in deltas and "text_delta" in deltas
    # a past thinking block goes back to the template as reasoning, and the turn renders
    history = ask + [{"role": "assistant", "content": [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                                       {"type": "text", "text": ANSWER}]}, {"role": "user", "content": "again"}]
    assert client.messages.count_tokens(model="toy", messages=history).input_tokens > 0


def test_both_key_headers(app):
    body = {"model": "toy", "max_tokens": 4, "messages": HI}
    assert app.post("/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
    assert app.post("/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert app.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 4}, headers={"x-api-key": KEY}).status_code == 200
    for headers in ({}, {"x-api-key": "nope"}, {"Authorization": "Bearer nope"}):
        r = app.post("/v1/messages", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_stop_reason_mapping_and_the_matched_stop_string():
    usage = Usage(1, 1)
    assert stop_reason(Finish("length", usage, None, 0)) == "max_tokens"
    assert stop_reason(Finish("stop", usage, "END", 0)) == "stop_sequence"
    assert stop_reason(Finish("stop", usage, None, 2)) == "tool_use"
    assert stop_reason(Finish("stop", usage, None, 0)) == "end_turn"
    m = StopMatcher(("xyz", "b"))
    assert m.feed("a") == ("a", False) and m.feed("xy") == ("", False)
    assert m.feed("zb") == ("", True) and m.matched == "xyz"  # the earliest match, across deltas


def msg(**fields):
    return {"model": "toy", "max_tokens": 8, "messages": HI, **fields}


USER_BLOCKS = lambda *blocks: [{"role": "user", "content": list(blocks)}]  # noqa: E731

BAD = [
    ("malformed JSON", {"content": b'{"model": "toy", '}, 400),
    ("body a list", {"content": b"[]"}, 400),
    ("empty body", {"content": b""}, 400),
    ("model missing", {"json": {"max_tokens": 8, "messages": HI}}, 400),
    ("unknown model", {"json": msg(model="claude-x")}, 404),
    ("max_tokens missing", {"json": {"model": "toy", "messages": HI}}, 400),
    ("max_tokens zero", {"json": msg(max_tokens=0)}, 400),
    ("max_tokens a string", {"json": msg(max_tokens="8")}, 400),
    ("max_tokens beyond the context", {"json": msg(max_tokens=10**9)}, 400),
    ("messages empty", {"json": msg(messages=[])}, 400),
    ("messages a string", {"json": msg(messages="hi")}, 400),
    ("role system in messages", {"json": msg(messages=[{"role": "system", "content": "x"}])}, 400),
    ("content a number", {"json": msg(messages=[{"role": "user", "content": 5}])}, 400),
    ("image block", {"json": msg(messages=USER_BLOCKS({"type": "image", "source": {"type": "base64", "data": "x"}}))}, 400),
    ("document block", {"json": msg(messages=USER_BLOCKS({"type": "document"}))}, 400),
    ("text block without text", {"json": msg(messages=USER_BLOCKS({"type": "text"}))}, 400),
    ("tool_result without id", {"json": msg(messages=USER_BLOCKS({"type": "tool_result", "content": "x"}))}, 400),
    ("tool_use in a user turn", {"json": msg(messages=USER_BLOCKS({"type": "tool_use", "id": "t", "name": "f", "input": {}}))}, 400),
    ("tool_use without name", {"json": msg(messages=HI + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}])}, 400),
    ("tool_use input a list", {"json": msg(messages=HI + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}])}, 400),
    ("system an image block", {"json": msg(system=[{"type": "image"}])}, 400),
    ("temperature above one", {"json": msg(temperature=1.5)}, 400),
    ("temperature a string", {"json": msg(temperature="hot")}, 400),
    ("top_p zero", {"json": msg(top_p=0)}, 400),
    ("top_k negative", {"json": msg(top_k=-1)}, 400),
    ("stop_sequences a string", {"json": msg(stop_sequences="END")}, 400),
    ("stop_sequences with an empty one", {"json": msg(stop_sequences=[""])}, 400),
    ("stop_sequences too many", {"json": msg(stop_sequences=[f"s{i}" for i in range(40)])}, 400),
    ("stream a string", {"json": msg(stream="yes")}, 400),
    ("tools not a list", {"json": msg(tools={"name": "f"})}, 400),
    ("tool without a name", {"json": msg(tools=[{"input_schema": {}}])}, 400),
    ("server tool", {"json": msg(tools=[{"type": "web_search_20250305", "name": "web_search"}])}, 400),
    ("tool_choice any without tools", {"json": msg(tool_choice={"type": "any"})}, 400),
    ("tool_choice an unknown tool", {"json": msg(tools=[{"name": "f"}], tool_choice={"type": "tool", "name": "g"})}, 400),
    ("tool_choice unknown type", {"json": msg(tool_choice={"type": "maybe"})}, 400),
    ("thinking unknown type", {"json": msg(thinking={"type": "always"})}, 400),
    ("output_config format not a json_schema", {"json": msg(output_config={"format": {"type": "regex", "schema": {}}})}, 400),
    ("output_config format without schema", {"json": msg(output_config={"format": {"type": "json_schema"}})}, 400),
    ("output_config format unsupported keyword", {"json": msg(output_config={"format": {"type": "json_schema",
                                                                                       "schema": {"not": {"type": "string"}}}})}, 400),
    ("mcp_servers", {"json": msg(mcp_servers=[{"type": "url", "url": "http://x"}])}, 400),
    ("prompt beyond the context", {"json": msg(messages=[{"role": "user", "content": "x" * 5000}])}, 400),
    ("count_tokens without messages", {"json": {"model": "toy"}, "path": "/v1/messages/count_tokens"}, 400),
    ("count_tokens unknown model", {"json": {"model": "m", "messages": HI}, "path": "/v1/messages/count_tokens"}, 404),
    ("wrong method", {"method": "GET"}, 405),
]


@pytest.mark.parametrize("name,kwargs,status", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_anthropic_errors(app, name, kwargs, status):
    kwargs = dict(kwargs)
    method, path = kwargs.pop("method", "POST"), kwargs.pop("path", "/v1/messages")
    r = app.request(method, path, headers={"x-api-key": KEY}, **kwargs)
    assert r.status_code == status, r.text[:300]
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    assert body["error"]["type"] == {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error"}[status]


def test_the_official_client_raises_typed_errors_and_the_app_keeps_serving(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="toy", max_tokens=8, messages=HI, extra_body={"temperature": 3})
    assert "temperature" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=8, messages=HI)
    assert client.messages.create(model="toy", max_tokens=8, messages=HI).content[0].text == "plain wo"
