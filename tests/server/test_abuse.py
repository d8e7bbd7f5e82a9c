"""Bad requests against the live server: each gets a 4xx in the OpenAI envelope (never a 5xx),
and the server keeps serving afterwards (health, then a normal request)."""

import threading
import time

import httpx
import pytest

from tests.server.live import KEY, MODEL

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}


def comp(**fields):
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}


def chunked(total, piece=1 << 16):
    sent = 0
    while sent < total:
        yield b"x" * piece
        sent += piece


NESTED = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"

# (name, method, path, request kwargs for httpx, expected status)
CASES = [
    ("malformed JSON", "POST", CHAT, {"content": b'{"messages": [{"role": "user", '}, 400),
    ("body is a list", "POST", CHAT, {"content": b"[]"}, 400),
    ("body is a string", "POST", CHAT, {"content": b'"hello"'}, 400),
    ("empty body", "POST", CHAT, {"content": b""}, 400),
    ("invalid UTF-8 bytes", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}'}, 400),
    ("NaN literal", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'}, 400),
    ("JSON nested 5000 deep", "POST", CHAT, {"content": NESTED}, 400),
    ("messages is a string", "POST", CHAT, {"json": chat(messages="hi")}, 400),
    ("messages empty", "POST", CHAT, {"json": chat(messages=[])}, 400),
    ("messages null", "POST", CHAT, {"json": chat(messages=None)}, 400),
    ("messages missing", "POST", CHAT, {"json": {"model": MODEL}}, 400),
    ("invalid role", "POST", CHAT, {"json": chat(messages=[{"role": "wizard", "content": "hi"}])}, 400),
    ("role null", "POST", CHAT, {"json": chat(messages=[{"role": None, "content": "hi"}])}, 400),
    ("user content null", "POST", CHAT, {"json": chat(messages=[{"role": "user", "content": None}])}, 400),
    ("content is a number", "POST", CHAT, {"json": chat(messages=[{"role": "user", "content": 42}])}, 400),
    ("image content part", "POST", CHAT, {"json": chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}])}, 400),
    ("temperature is a string", "POST", CHAT, {"json": chat(temperature="hot")}, 400),
    ("temperature negative", "POST", CHAT, {"json": chat(temperature=-1)}, 400),
    ("temperature huge", "POST", CHAT, {"json": chat(temperature=1e308)}, 400),
    ("top_p zero", "POST", CHAT, {"json": chat(top_p=0)}, 400),
    ("top_p above one", "POST", CHAT, {"json": chat(top_p=1.5)}, 400),
    ("top_k negative", "POST", CHAT, {"json": chat(top_k=-5)}, 400),
    ("min_p above one", "POST", CHAT, {"json": chat(min_p=2)}, 400),
    ("max_tokens zero", "POST", CHAT, {"json": chat(max_tokens=0)}, 400),
    ("max_tokens negative", "POST", CHAT, {"json": chat(max_tokens=-1)}, 400),
    ("max_tokens beyond the context", "POST", CHAT, {"json": chat(max_tokens=10**9)}, 400),
    ("max_tokens a 40-digit number", "POST", CHAT, {"json": chat(max_tokens=10**40)}, 400),
    ("max_tokens a float", "POST", CHAT, {"json": chat(max_tokens=4.5)}, 400),
    ("n zero", "POST", CHAT, {"json": chat(n=0)}, 400),
    ("n huge", "POST", CHAT, {"json": chat(n=10**6)}, 400),
    ("n a string", "POST", CHAT, {"json": chat(n="2")}, 400),
    ("seed beyond 64 bits", "POST", CHAT, {"json": chat(seed=2**70)}, 400),
    ("stream a string", "POST", CHAT, {"json": chat(stream="yes")}, 400),
    ("stop a number", "POST", CHAT, {"json": chat(stop=5)}, 400),
    ("stop 100 strings", "POST", CHAT, {"json": chat(stop=[f"s{i}" for i in range(100)])}, 400),
    ("stop empty string", "POST", CHAT, {"json": chat(stop=[""])}, 400),
    ("top_logprobs 50", "POST", CHAT, {"json": chat(logprobs=True, top_logprobs=50)}, 400),
    ("top_logprobs without logprobs", "POST", CHAT, {"json": chat(top_logprobs=2)}, 400),
    ("presence_penalty", "POST", CHAT, {"json": chat(presence_penalty=1.0)}, 400),
    ("tools not a list", "POST", CHAT, {"json": chat(tools="get_weather")}, 400),
    ("tool_choice required without tools", "POST", CHAT, {"json": chat(tool_choice="required")}, 400),
    ("tool_choice an unknown function", "POST", CHAT, {"json": chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                                    tool_choice={"type": "function", "function": {"name": "g"}})}, 400),
    ("tool call arguments not JSON", "POST", CHAT, {"json": chat(messages=USER + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}])}, 400),
    ("chat_template_kwargs a list", "POST", CHAT, {"json": chat(chat_template_kwargs=[1])}, 400),
    ("chat_template_kwargs overrides messages", "POST", CHAT, {"json": chat(chat_template_kwargs={"messages": []})}, 400),
    ("unknown model", "POST", CHAT, {"json": chat(model="gpt-17")}, 404),
    ("prompt null", "POST", COMP, {"json": comp(prompt=None)}, 400),
    ("prompt empty list", "POST", COMP, {"json": comp(prompt=[])}, 400),
    ("prompt a list of mixed types", "POST", COMP, {"json": comp(prompt=[1, "a", None, 2.5])}, 400),
    ("prompt token id out of range", "POST", COMP, {"json": comp(prompt=[10**9])}, 400),
    ("prompt token id negative", "POST", COMP, {"json": comp(prompt=[1, -1])}, 400),
    ("prompt longer than the context", "POST", COMP, {"json": comp(prompt=[5] * 5000)}, 400),
    ("prompts x n over the cap", "POST", COMP, {"json": comp(prompt=["a"] * 5, n=2)}, 400),
    ("completion logprobs 100", "POST", COMP, {"json": comp(logprobs=100)}, 400),
    ("echo", "POST", COMP, {"json": comp(echo=True)}, 400),
    ("detokenize ids out of range", "POST", "/detokenize", {"json": {"tokens": [2**40]}}, 400),
    ("detokenize tokens null", "POST", "/detokenize", {"json": {"tokens": None}}, 400),
    ("tokenize prompt and messages", "POST", "/tokenize", {"json": {"prompt": "a", "messages": USER}}, 400),
    ("10 MB body", "POST", CHAT, {"content": b"x" * (10 << 20)}, 413),
    ("10 MB chunked body", "POST", CHAT, {"content": chunked(10 << 20)}, 413),
    ("unknown route", "POST", "/v1/embeddings", {"json": {}}, 404),
    ("wrong method", "GET", CHAT, {}, 405),
    ("no API key", "POST", CHAT, {"json": chat(), "headers": {"Authorization": ""}}, 401),
    ("wrong API key", "POST", CHAT, {"json": chat(), "headers": {"Authorization": "Bearer nope"}}, 401),
    ("wrong auth scheme", "POST", CHAT, {"json": chat(), "headers": {"Authorization": f"Basic {KEY}"}}, 401),
]


@pytest.mark.parametrize("name,method,path,kwargs,status", CASES, ids=[c[0] for c in CASES])
def test_abuse_gets_a_4xx_in_the_openai_envelope(http, name, method, path, kwargs, status):
    r = http.request(method, path, **kwargs)
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err and "param" in err and "code" in err


@pytest.mark.parametrize("size", [100 << 10, 200 << 10, 900 << 10])
def test_huge_headers_get_a_431(server, size):
    # 100 KB arrives in one read, which h11's own limit never sees; the Gate counts every head up to
    # the 1 MB h11 buffers, so each of these gets the same answer, in the envelope
    r = httpx.post(server.url + CHAT, json=chat(), headers={"X-Junk": "a" * size, "Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 431, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "request_header_fields_too_large" and "the limit is 65536 bytes" in err["message"]


def test_headers_beyond_the_head_buffer_get_a_plain_400_or_a_reset(server):
    try:
        r = httpx.post(server.url + CHAT, json=chat(), headers={"X-Junk": "a" * (2 << 20), "Authorization": f"Bearer {KEY}"},
                       timeout=30)
        assert r.status_code == 400 and "Invalid HTTP request" in r.text  # h11's answer, before any of our code runs
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        pass  # h11 answers and closes while we are still sending: the reset can beat the answer


def test_numbers_are_in_the_messages(http):
    r = http.post(COMP, json=comp(prompt=[5] * 5000)).json()["error"]
    assert "5000 tokens" in r["message"] and "2048" in r["message"] and r["param"] == "prompt"
    r = http.post(CHAT, json=chat(max_tokens=10**9)).json()["error"]
    assert "1000000000" in r["message"] and "2048" in r["message"] and r["param"] == "max_tokens"


def test_many_clients_disconnecting_at_once_mid_stream(server):
    clients = 8
    opened = threading.Barrier(clients + 1)
    statuses = []

    def one():
        try:
            with httpx.stream("POST", server.url + CHAT, json=chat(max_tokens=200, stream=True), timeout=120,
                              headers={"Authorization": f"Bearer {KEY}"}) as r:
                statuses.append(r.status_code)  # the stream is open: one is generating, the rest wait in the queue
                opened.wait(60)
        except (httpx.HTTPError, threading.BrokenBarrierError):
            pass  # leaving the block closes the connection: all of them at once

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    opened.wait(60)
    for t in threads:
        t.join(60)
    assert statuses == [200] * clients
    for _ in range(100):  # the waiting ones leave the queue at once, the running one stops at its next step
        health = httpx.get(server.url + "/health").json()
        if health["queue_depth"] == 0:
            break
        time.sleep(0.1)
    assert health["queue_depth"] == 0


def test_still_serving_after_all_of_it(server, http):
    assert httpx.get(server.url + "/health").status_code == 200
    r = http.post(CHAT, json=chat(max_tokens=4, temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    metrics = httpx.get(server.url + "/metrics").text
    assert 'status="500"' not in metrics, [l for l in metrics.splitlines() if 'status="5' in l]
    assert "treeflash_queue_depth 0.0" in metrics
