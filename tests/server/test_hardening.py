"""Hardening found by an outside QA run, each with its test: a server-side default and cap for
max_tokens, the queue wait in /metrics, JSON-only bodies (415), the Host check against DNS
rebinding, stream_options without stream, and a slow request body timing out on a live server."""

import socket
import time

import pytest
from fastapi.testclient import TestClient

from tests.server.live import TOY, LiveServer
from tests.server.scripted import StubEngine
from tests.server.stub_app import KEY, stub_client
from treeflash.errors import InvalidRequestError
from treeflash.server.app import ServerConfig, create_app
from treeflash.server.frontend import TokenLimits
from treeflash.server.hosts import HostPolicy, host_name

AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi"}]


def test_max_tokens_default_and_cap():
    with stub_client(limits=TokenLimits(default_max_tokens=5, max_tokens=50)) as c:
        r = c.post("/v1/chat/completions", json={"messages": HI}, headers=AUTH).json()
        assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"  # the default, not the context
        r = c.post("/v1/completions", json={"prompt": "hi"}, headers=AUTH).json()
        assert r["usage"]["completion_tokens"] == 5
        assert c.post("/v1/responses", json={"input": "hi"}, headers=AUTH).json()["usage"]["output_tokens"] == 5
        assert c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 50}, headers=AUTH).status_code == 200
        for path, body, param in (("/v1/chat/completions", {"messages": HI, "max_tokens": 51}, "max_tokens"),
                                  ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 51}, "max_completion_tokens"),
                                  ("/v1/completions", {"prompt": "hi", "max_tokens": 51}, "max_tokens"),
                                  ("/v1/responses", {"input": "hi", "max_output_tokens": 51}, "max_output_tokens")):
            r = c.post(path, json=body, headers=AUTH)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
            assert "51" in r.json()["error"]["message"] and "50" in r.json()["error"]["message"]
        r = c.post("/v1/messages", json={"model": "toy", "messages": HI, "max_tokens": 51}, headers=AUTH)
        assert r.status_code == 400 and "max_tokens is 51" in r.json()["error"]["message"]
        # the default never exceeds the room the context leaves
    with stub_client(max_context=80, limits=TokenLimits(default_max_tokens=4096)) as c:
        r = c.post("/v1/completions", json={"prompt": "x" * 70}, headers=AUTH).json()
        assert r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] <= 80
    with pytest.raises(InvalidRequestError, match="--max-tokens-cap"):
        TokenLimits(max_tokens=0)


def test_queue_wait_is_in_the_metrics():
    with stub_client() as c:
        c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3}, headers=AUTH)
        metrics = c.get("/metrics").text
    assert "treeflash_queue_wait_seconds_count 1.0" in metrics


def test_stream_options_need_stream():
    with stub_client() as c:
        r = c.post("/v1/chat/completions", json={"messages": HI, "stream_options": {"include_usage": True}}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
        r = c.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
                   headers=AUTH)
        assert r.status_code == 200


def test_only_json_bodies():
    with stub_client() as c:
        body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
        for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/html"):
            r = c.post("/v1/chat/completions", content=body, headers={**AUTH, "Content-Type": media})
            assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], media
            r = c.post("/v1/messages", content=body, headers={**AUTH, "Content-Type": media})
            assert r.status_code == 415 and r.json()["type"] == "error"  # Anthropic's envelope on its route
        for media in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
            assert c.post("/v1/chat/completions", content=body, headers={**AUTH, "Content-Type": media}).status_code == 200
        assert c.post("/v1/chat/completions", content=body, headers=AUTH).status_code == 200  # no type: not a browser's simple request


def test_host_names():
    assert host_name("Example.COM:8000") == "example.com" and host_name("[::1]:8000") == "::1" and host_name("localhost.") == "localhost"
    assert host_name("127.0.0.1") == "127.0.0.1"
    loop = HostPolicy("127.0.0.1")
    assert loop.checks and all(loop.allows(h) for h in ("localhost:8000", "127.0.0.1:1", "[::1]:80", "LOCALHOST"))
    assert not any(loop.allows(h) for h in ("evil.example:8000", "127.0.0.1.evil.example", "", None, "localhost.evil"))
    assert HostPolicy("127.0.0.1", ("my.lan",)).allows("my.lan:8000")
    assert HostPolicy("127.0.0.1", ("*",)).allows("anything")
    assert HostPolicy("0.0.0.0").allows("anything")  # exposed on purpose: no check unless names are given
    assert not HostPolicy("0.0.0.0", ("my.lan",)).allows("other.lan") and HostPolicy("0.0.0.0", ("my.lan",)).allows("my.lan")
    with pytest.raises(InvalidRequestError):
        HostPolicy("127.0.0.1", ("a/b",))


def test_a_loopback_server_refuses_other_hosts():
    app = create_app(ServerConfig("toy", hosts=HostPolicy("127.0.0.1")), lambda: StubEngine())
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/v1/models").status_code == 200
        for host in ("evil.example", "evil.example:8000", "localhost.evil.example"):
            for path in ("/v1/models", "/health", "/v1/chat/completions"):
                r = c.get(path, headers={"Host": host})
                assert r.status_code == 403 and "--allowed-hosts" in r.json()["error"]["message"], (host, path)
        r = c.post("/v1/messages", json={}, headers={"Host": "evil.example"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert c.get("/v1/models", headers={"Host": "localhost:8000"}).status_code == 200


@pytest.fixture(scope="module")
def slow_body_server():
    server = LiveServer(["--body-timeout", "1"], module=TOY).wait_ready(120)
    yield server
    server.stop()


def test_a_slow_body_times_out_on_a_live_server(slow_body_server):
    s = slow_body_server
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 200\r\n\r\n").encode()
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(head + b"{")
        answer = b""
        try:
            for _ in range(30):  # a byte every 0.2 s: the body would take 40 s
                sock.sendall(b" ")
                sock.settimeout(0.2)
                try:
                    answer += sock.recv(4096)
                except socket.timeout:
                    continue
                if answer:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(5)
        while b"\r\n\r\n" not in answer:
            more = sock.recv(4096)
            if not more:
                break
            answer += more
    elapsed = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"--body-timeout" in answer or b"did not arrive" in answer or b"content-length" in answer.lower()
    assert elapsed < 4, elapsed
    import httpx

    assert httpx.get(s.url + "/health").status_code == 200  # and the server goes on
