"""POST /v1/responses through the openai client, in-process over the scripted stub engine: text,
streaming equal to the non-streaming reply, a function-call round trip (by items and by
previous_response_id), reasoning items, the bounded store, and bad requests answered in OpenAI's
error envelope while the app keeps serving."""

import openai
import pytest

from tests.server.scripted import ANSWER, THINK_TRIGGER, THOUGHT, TOOL_REPLY_PREFIX, TOOL_TRIGGER
from tests.server.stub_app import KEY, stub_client

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
CALLS = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "Europe/Paris"}')]


@pytest.fixture(scope="module")
def app():
    with stub_client(responses_store=3) as tc:
        yield tc


@pytest.fixture(scope="module")
def client(app):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=app, max_retries=0)


def items(response) -> list[dict]:
    """Output items without their ids (fresh per response)."""
    out = []
    for item in response.output:
        d = item.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        for part in d.get("content", []):
            part.pop("parsed", None)
        out.append(d)
    return out


def test_text_reply_and_usage(client):
    r = client.responses.create(model="toy", input="hi", instructions="Be brief.", max_output_tokens=64)
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_") and r.model == "toy"
    assert r.output_text == "plain words from a stub" and [i.type for i in r.output] == ["message"]
    assert r.instructions == "Be brief." and r.max_output_tokens == 64
    u = r.usage
    assert u.output_tokens == len("plain words from a stub") and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(model="toy", input="hi", max_output_tokens=7)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.output_text == "plain w"


def test_stream_events_and_fold_agree(client):
    whole = client.responses.create(model="toy", input="hi", max_output_tokens=64)
    events = list(client.responses.create(model="toy", input="hi", max_output_tokens=64, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert items(events[-1].response) == items(whole)
    with client.responses.stream(model="toy", input="hi", max_output_tokens=64) as s:
        assert items(s.get_final_response()) == items(whole)


def test_function_call_round_trip_by_items_and_by_previous_response_id(client):
    ask = f"What is the weather in Paris? {TOOL_TRIGGER}"
    r = client.responses.create(model="toy", input=ask, tools=TOOLS)
    assert [i.type for i in r.output] == ["message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "Let me check."
    assert [(i.name, i.arguments) for i in r.output[1:]] == CALLS
    outputs = [{"type": "function_call_output", "call_id": r.output[1].call_id, "output": "sunny"},
               {"type": "function_call_output", "call_id": r.output[2].call_id, "output": "noon"}]
    want = TOOL_REPLY_PREFIX + "get_weather: sunny; get_time: noon"
    # the client sends the whole conversation back
    history = [{"role": "user", "content": ask}] + [i.model_dump(exclude_none=True) for i in r.output] + outputs
    assert client.responses.create(model="toy", input=history, tools=TOOLS).output_text == want
    # or continues from the stored response
    assert client.responses.create(model="toy", previous_response_id=r.id, input=outputs, tools=TOOLS).output_text == want
    # streamed calls: arguments delta and done events carry the same arguments
    events = list(client.responses.create(model="toy", input=ask, tools=TOOLS, stream=True))
    done = [(e.name, e.arguments) for e in events if e.type == "response.function_call_arguments.done"]
    assert done == CALLS


def test_reasoning_items(client):
    ask = f"Greet me. {THINK_TRIGGER}"
    r = client.responses.create(model="toy", input=ask, reasoning={"effort": "high"})
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(client.responses.create(model="toy", input=ask, reasoning={"effort": "high"}, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THOUGHT
    # a reasoning item sent back renders (as the assistant turn's reasoning)
    history = [{"role": "user", "content": ask}] + [i.model_dump(exclude_none=True) for i in r.output] + [
        {"role": "user", "content": "again"}]
    assert client.responses.create(model="toy", input=history).status == "completed"


def test_store_is_bounded_and_store_false_keeps_nothing(client):
    kept = client.responses.create(model="toy", input="hi", max_output_tokens=4)
    not_kept = client.responses.create(model="toy", input="hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="toy", previous_response_id=not_kept.id, input="more")
    assert e.value.body["param"] == "previous_response_id" and "not kept" in e.value.body["message"]
    assert client.responses.create(model="toy", previous_response_id=kept.id, input="more", max_output_tokens=4).status
    for _ in range(3):  # the store holds 3 (stub_client(responses_store=3)): the oldest is evicted
        client.responses.create(model="toy", input="hi", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="last 3 stored responses"):
        client.responses.create(model="toy", previous_response_id=kept.id, input="more")


def resp(**fields):
    return {"model": "toy", "input": "hi", "max_output_tokens": 8, **fields}


BAD = [
    ("malformed JSON", {"content": b'{"input": '}, 400),
    ("body a string", {"content": b'"hi"'}, 400),
    ("empty body", {"content": b""}, 400),
    ("input missing", {"json": {"model": "toy"}}, 400),
    ("input a number", {"json": resp(input=5)}, 400),
    ("input empty list", {"json": resp(input=[])}, 400),
    ("unknown model", {"json": resp(model="gpt-17")}, 404),
    ("item without type or role", {"json": resp(input=[{"content": "hi"}])}, 400),
    ("item of unknown type", {"json": resp(input=[{"type": "computer_call"}])}, 400),
    ("message item without content", {"json": resp(input=[{"type": "message", "role": "user"}])}, 400),
    ("image part", {"json": resp(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])}, 400),
    ("function_call without call_id", {"json": resp(input=[{"type": "function_call", "name": "f", "arguments": "{}"}])}, 400),
    ("function_call arguments not JSON", {"json": resp(input=[{"role": "user", "content": "hi"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}])}, 400),
    ("function_call_output without output", {"json": resp(input=[{"type": "function_call_output", "call_id": "c"}])}, 400),
    ("only instructions, no message", {"json": resp(input=[{"role": "system", "content": "x"}])}, 400),
    ("item_reference", {"json": resp(input=[{"type": "item_reference", "id": "msg_1"}])}, 400),
    ("max_output_tokens zero", {"json": resp(max_output_tokens=0)}, 400),
    ("max_output_tokens beyond the context", {"json": resp(max_output_tokens=10**9)}, 400),
    ("temperature above two", {"json": resp(temperature=3)}, 400),
    ("top_p zero", {"json": resp(top_p=0)}, 400),
    ("stream a string", {"json": resp(stream="yes")}, 400),
    ("stream_options without stream", {"json": resp(stream_options={"include_obfuscation": False})}, 400),
    ("built-in tool", {"json": resp(tools=[{"type": "web_search"}])}, 400),
    ("function tool without name", {"json": resp(tools=[{"type": "function"}])}, 400),
    ("tool_choice required without tools", {"json": resp(tool_choice="required")}, 400),
    ("tool_choice an unknown function", {"json": resp(tools=TOOLS, tool_choice={"type": "function", "name": "nope"})}, 400),
    ("text.format unknown type", {"json": resp(text={"format": {"type": "xml"}})}, 400),
    ("text.format json_schema without schema", {"json": resp(text={"format": {"type": "json_schema", "name": "x"}})}, 400),
    ("text.format schema not JSON", {"json": resp(text={"format": {"type": "json_schema", "name": "x", "schema": "{nope"}})}, 400),
    ("background", {"json": resp(background=True)}, 400),
    ("top_logprobs", {"json": resp(top_logprobs=3)}, 400),
    ("include unknown", {"json": resp(include=["file_search_call.results"])}, 400),
    ("conversation", {"json": resp(conversation="conv_1")}, 400),
    ("previous_response_id unknown", {"json": resp(previous_response_id="resp_nope")}, 400),
    ("prompt beyond the context", {"json": resp(input="x" * 5000)}, 400),
    ("wrong method", {"method": "GET"}, 405),
]


@pytest.mark.parametrize("name,kwargs,status", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_openai_errors(app, name, kwargs, status):
    kwargs = dict(kwargs)
    r = app.request(kwargs.pop("method", "POST"), "/v1/responses", headers={"Authorization": f"Bearer {KEY}"}, **kwargs)
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and {"type", "param", "code"} <= set(err)


def test_still_serving_after_bad_requests(client, app):
    assert app.get("/health").status_code == 200
    assert client.responses.create(model="toy", input="hi", max_output_tokens=5).output_text == "plain"
