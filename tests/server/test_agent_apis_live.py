"""/v1/messages and /v1/responses on the live toy server (a real uvicorn on loopback, the real
engine over a random model): streams arrive as server-sent events through the official clients,
a client that leaves mid-stream cancels the generation, and the routes are counted in /metrics."""

import time

import anthropic
import httpx
import openai

from tests.server.scripted import ANSWER, THINK_TRIGGER, TOOL_TRIGGER


def test_anthropic_client_streams_from_the_live_server(toy):
    c = anthropic.Anthropic(base_url=toy.url, api_key="none", max_retries=0, timeout=60)
    with c.messages.stream(model="toy", max_tokens=300, messages=[{"role": "user", "content": f"x {THINK_TRIGGER}"}],
                           thinking={"type": "enabled", "budget_tokens": 64}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == ANSWER and [b.type for b in final.content] == ["thinking", "text"]
    m = c.messages.create(model="toy", max_tokens=300, messages=[{"role": "user", "content": TOOL_TRIGGER}],
                          tools=[{"name": "get_weather", "input_schema": {"type": "object"}}])
    assert m.stop_reason == "tool_use" and [b.name for b in m.content if b.type == "tool_use"] == ["get_weather", "get_time"]
    # the real engine (random weights): max_tokens is exact, usage counts it
    m = c.messages.create(model="toy", max_tokens=6, messages=[{"role": "user", "content": "plain"}],
                          extra_body={"temperature": 0})
    assert m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens <= 6


def test_openai_client_streams_responses_from_the_live_server(toy):
    c = openai.OpenAI(base_url=toy.url + "/v1", api_key="none", max_retries=0, timeout=60)
    with c.responses.stream(model="toy", input=f"x {THINK_TRIGGER}", reasoning={"effort": "high"}) as s:
        final = s.get_final_response()
    assert final.output_text == ANSWER and [i.type for i in final.output] == ["reasoning", "message"]
    r = c.responses.create(model="toy", input="plain", max_output_tokens=6, temperature=0)
    assert r.usage.output_tokens <= 6 and r.status in ("completed", "incomplete")


def test_leaving_mid_stream_cancels_and_routes_are_counted(toy):
    body = {"model": "toy", "max_tokens": 400, "messages": [{"role": "user", "content": "long"}], "stream": True}
    with httpx.stream("POST", toy.url + "/v1/messages", json={**body, "temperature": 0}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "content_block_delta" in line:
                break  # leave after the first delta
    for _ in range(100):  # the engine stops at its next step: nothing runs, nothing waits
        metrics = httpx.get(toy.url + "/metrics").text
        if "treeflash_requests_running 0.0" in metrics:
            break
        time.sleep(0.1)
    assert "treeflash_requests_running 0.0" in metrics
    assert 'route="/messages"' in metrics and 'route="/responses"' in metrics
