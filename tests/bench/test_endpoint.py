"""The endpoint client against a tiny scripted OpenAI-style SSE server on 127.0.0.1."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from treeflash.bench.endpoint import EndpointError, EndpointTarget, api_base
from treeflash.bench.prompts import BenchPrompt, user
from treeflash.bench.runner import BenchSettings
from treeflash.cli.main import main

FIRST_DELAY = 0.3  # seconds before the first text chunk (the "prefill")
STEP = 0.05  # seconds between text chunks


class Handler(BaseHTTPRequestHandler):
    requests: list = []
    usage = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.requests.append((self.path, body, self.headers.get("Authorization")))
        if body.get("max_tokens", 0) > 1000:
            return self._json(400, {"error": {"message": "max_tokens too large", "type": "invalid_request_error"}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chat = self.path.endswith("/chat/completions")

        def send(obj):
            self.wfile.write(b": keep-alive\n\n" if obj is None else f"data: {json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        if chat:
            send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})  # role-only chunk: not a token
        time.sleep(FIRST_DELAY)
        pieces = ["Hel", "lo", " wor", "ld", "!"]  # 5 chunks carrying 9 tokens (speculation sends several per chunk)
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(STEP)
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            send({"choices": [choice]})
            send(None)
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if Handler.usage:
            send({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16,
                                           "spec": {"tau": 1.8, "passes": 5, "committed": 9}}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    Handler.requests, Handler.usage = [], True
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_api_base():
    assert api_base("http://h:1") == api_base("http://h:1/v1/") == "http://h:1/v1"


def test_chat_stream_ttft_and_usage(server):
    t = EndpointTarget(server, api_key="sk-test")
    assert t.model == "fake-model"
    r = t.run(user("hi", "say hello"), BenchSettings(), 64)
    path, body, auth = Handler.requests[-1]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 64
    assert body["messages"] == [{"role": "user", "content": "say hello"}]
    assert FIRST_DELAY * 0.9 <= r.first_token_s < FIRST_DELAY + 0.25
    assert 4 * STEP * 0.9 <= r.decode_s < 4 * STEP + 0.25
    assert r.completion_tokens == 9 and r.prompt_tokens == 7 and r.finish_reason == "length"
    assert r.decode_tps == pytest.approx(8 / r.decode_s)
    assert r.spec["tau"] == 1.8 and r.extra["usage"]["completion_tokens"] == 9 and "tokens_estimated" not in r.extra


def test_raw_prompt_uses_completions_and_counts_chunks_without_usage(server):
    Handler.usage = False
    t = EndpointTarget(server, model="m")
    r = t.run(BenchPrompt("raw", text="Once upon"), BenchSettings(temperature=0.7, seed=3, ignore_eos=True), 32)
    path, body, _ = Handler.requests[-1]
    assert path == "/v1/completions" and body["prompt"] == "Once upon" and body["model"] == "m"
    assert body["seed"] == 3 and body["ignore_eos"] is True
    assert r.completion_tokens == 5 and r.extra["tokens_estimated"] is True and r.spec is None


def test_http_error_is_an_endpoint_error(server):
    with pytest.raises(EndpointError, match="HTTP 400.*max_tokens too large"):
        EndpointTarget(server).run(user("hi", "x"), BenchSettings(), 5000)
    with pytest.raises(EndpointError, match="cannot connect"):
        EndpointTarget("http://127.0.0.1:9")


def test_cli_endpoint_json(server, tmp_path):
    out = tmp_path / "e.json"
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n", encoding="utf-8")
    rc = main(["bench", "--endpoint", server, "--prompts", str(prompts), "--runs", "2", "--max-tokens", "16",
               "--warmup", "0", "--json", str(out), "--quiet"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 4 and doc["config"]["targets"][0]["kind"] == "endpoint"
    s = doc["summary"]
    assert s["tau"] == 1.8 and s["speedup_vs_baseline"] is None and s["ttft_s"] >= FIRST_DELAY * 0.9
