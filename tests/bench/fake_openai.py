"""A tiny scripted OpenAI-style SSE server on 127.0.0.1 (stdlib only), for endpoint tests."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

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
