"""A live server over the toy engine, for what the real model cannot be made to do on cue: a slow
load (503), a full queue (429), a failure inside one generation (500), clients that disconnect
mid-generation, a shutdown with requests in flight, and a model that fails to load."""

import json
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server.live import TOY, LiveServer
from tests.server.live import toy_chat_body as chat_body


def sse_events(response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[6:]


def test_503_while_loading_then_200(toy):
    assert toy.early_chat.status_code == 503
    assert toy.early_chat.json()["error"]["type"] == "service_unavailable"
    assert 503 in toy.health_seen and toy.health_seen[-1] == 200
    assert httpx.post(toy.url + "/v1/chat/completions", json=chat_body()).status_code == 200


def test_503_while_loading_through_the_openai_client(toy):
    e = toy.early_openai
    assert isinstance(e, openai.InternalServerError), e  # the openai client's class for every 5xx
    assert e.status_code == 503 and e.type == "service_unavailable"
    assert "still loading" in e.message and "GET /health" in e.message  # says what to do


def test_429_when_the_queue_is_full(toy):
    with httpx.Client(timeout=60) as running:
        with running.stream("POST", toy.url + "/v1/chat/completions", json=chat_body(180, stream=True)) as r:
            events = sse_events(r)  # keep a reference: a dropped generator closes the connection
            next(events)  # the engine is busy with this one now
            waiting = threading.Thread(target=lambda: httpx.post(toy.url + "/v1/chat/completions", json=chat_body(2), timeout=60))
            waiting.start()
            for _ in range(100):
                if httpx.get(toy.url + "/health").json()["queue_depth"] == 1:
                    break
                time.sleep(0.05)
            refused = httpx.post(toy.url + "/v1/chat/completions", json=chat_body())
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError) as e:
                OpenAI(base_url=toy.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
                    model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            assert e.value.status_code == 429 and "the queue is full (1 request waiting, the limit set by --max-queue)" in e.value.message
    waiting.join(30)  # the stream's disconnect cancelled it, so the waiting request ran soon after
    assert not waiting.is_alive()
    assert httpx.post(toy.url + "/v1/chat/completions", json=chat_body()).status_code == 200


def test_a_failure_inside_generation_is_a_500_for_that_request_only(toy):
    body = {"model": "toy", "prompt": "boom", "max_tokens": 8, "temperature": 0}
    r = httpx.post(toy.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 500 and "scripted failure" in r.json()["error"]["message"]
    with httpx.stream("POST", toy.url + "/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        events = list(sse_events(r))
    assert r.status_code == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "server_error"
    assert httpx.post(toy.url + "/v1/completions", json={**body, "prompt": "fine"}, timeout=30).status_code == 200


def test_a_failure_inside_generation_through_the_openai_client(toy_client):
    args = dict(model="toy", prompt="boom", max_tokens=8, temperature=0)
    with pytest.raises(openai.InternalServerError) as e:
        toy_client.completions.create(**args)
    assert e.value.status_code == 500 and e.value.type == "server_error"
    assert "generation failed: RuntimeError: scripted failure inside the engine" in e.value.message
    # streamed, the 200 has gone out: the client raises on the error event (an APIError, no status)
    with pytest.raises(openai.APIError, match="generation failed: RuntimeError: scripted failure") as e:
        list(toy_client.completions.create(stream=True, **args))
    assert not isinstance(e.value, openai.APIStatusError) and e.value.type == "server_error"
    assert toy_client.completions.create(**{**args, "prompt": "fine"}).choices[0].finish_reason == "length"


def test_413_through_the_openai_client(toy_client):
    with pytest.raises(openai.APIStatusError) as e:
        toy_client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "x" * (5 << 20)}], max_tokens=2)
    assert e.value.status_code == 413 and e.value.type == "invalid_request_error"
    assert "the limit is 4194304 bytes" in e.value.message and "the request body is 52" in e.value.message
    assert toy_client.chat.completions.create(model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices


def _quick_request_seconds(url):
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(2), timeout=60)
    assert r.status_code == 200
    return time.monotonic() - t0


def test_disconnect_cancels_a_stream_at_the_next_step(toy):
    # 180 tokens x 0.05 s: 9 s if it ran on; a cancelled one frees the engine at once
    with httpx.stream("POST", toy.url + "/v1/chat/completions", json=chat_body(180, stream=True), timeout=60) as r:
        events = sse_events(r)
        next(events), next(events)
    assert _quick_request_seconds(toy.url) < 5


def test_disconnect_cancels_a_non_streaming_request(toy):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(toy.url + "/v1/chat/completions", json=chat_body(180), timeout=httpx.Timeout(60, read=1.0))
    assert _quick_request_seconds(toy.url) < 5


def test_many_clients_disconnecting_at_once(toy):
    def one():
        try:
            with httpx.stream("POST", toy.url + "/v1/chat/completions", json=chat_body(180, stream=True), timeout=30) as r:
                if r.status_code == 200:
                    events = sse_events(r)
                    next(events)
        except httpx.HTTPError:
            pass

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert _quick_request_seconds(toy.url) < 5
    assert httpx.get(toy.url + "/health").json()["queue_depth"] == 0


def test_shutdown_ends_in_flight_requests_cleanly():
    server = LiveServer(["--step-delay", "0.05"], module=TOY).wait_ready(120)
    try:
        results = {}

        def queued():
            results["queued"] = httpx.post(server.url + "/v1/chat/completions", json=chat_body(180), timeout=60).status_code

        with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat_body(180, stream=True), timeout=60) as r:
            events = sse_events(r)
            next(events)
            t = threading.Thread(target=queued)
            t.start()
            time.sleep(0.5)
            t0 = time.monotonic()
            server.proc.send_signal(2)  # SIGINT
            rest = list(events)
        t.join(30)
        assert rest[-1] == "[DONE]" and "shutting down" in json.loads(rest[-2])["error"]["message"]
        assert results["queued"] == 503
        server.proc.wait(30)
        assert time.monotonic() - t0 < 10
        assert "Traceback" not in server.output(), server.output()
    finally:
        server.stop()


def test_a_model_that_fails_to_load_exits_with_a_message():
    server = LiveServer(["--fail-load", "--load-delay", "1"], module=TOY)
    try:
        assert server.proc.wait(120) == 2
        assert "scripted load failure" in server.output()
    finally:
        server.stop()
