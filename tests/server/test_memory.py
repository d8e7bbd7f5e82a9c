"""The server and memory: a request past the allocated context is a 400 naming the limit; out of
device memory inside a request ends that request with a 503 and the server goes on serving; /metrics
carries the memory plan the engine was sized by."""

import threading

import torch
from fastapi.testclient import TestClient

from tests.server.scripted import StubEngine
from treeflash.models.memory import Part
from treeflash.server.app import ServerConfig, create_app
from treeflash.spec.stats import SpecStats


class OutOfMemoryOnce(StubEngine):
    """Raises torch's OutOfMemoryError (what the CUDA allocator raises) in the first generation only."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.failures = 0
        self.config = type("Config", (), {"memory_plan": _Plan()})()
        self.totals = SpecStats()  # what /metrics reads of a real Engine besides the plan

    def stream(self, req, cancelled: threading.Event | None = None):
        if self.failures == 0:
            self.failures += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        yield from super().stream(req, cancelled)


class _Plan:
    parts = (Part("weights", 1000, ""), Part("kv cache K", 200, ""), Part("kv cache V", 100, ""))
    total = 1300


def _client(engine):
    app = create_app(ServerConfig("m"), lambda: engine)
    http = TestClient(app)
    http.__enter__()
    for _ in range(500):
        if http.get("/health").status_code == 200:
            return http
        threading.Event().wait(0.01)
    raise AssertionError("the stub engine did not become ready")


def _chat(http, content, **kw):
    return http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], **kw})


def test_out_of_memory_is_a_503_and_the_server_goes_on():
    http = _client(OutOfMemoryOnce())
    try:
        r = _chat(http, "hi", max_tokens=4)
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "out_of_memory" and "out of device memory" in err["message"] and "20.00 MiB" in err["message"]
        r = _chat(http, "hi", max_tokens=4)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        r = _chat(http, "hi", max_tokens=4, stream=True)
        assert r.status_code == 200
    finally:
        http.__exit__(None, None, None)


def test_requests_past_the_allocated_context_are_400s_naming_the_limit():
    http = _client(StubEngine(max_context=64))
    try:
        r = _chat(http, "x" * 100, max_tokens=4)
        assert r.status_code == 400 and "context is 64 tokens" in r.json()["error"]["message"]
        r = _chat(http, "hi", max_tokens=200)
        assert r.status_code == 400 and "exceeds the context length 64" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "max_tokens"
        assert _chat(http, "hi", max_tokens=4).status_code == 200
    finally:
        http.__exit__(None, None, None)


def test_metrics_carry_the_plan_and_the_allocated_context():
    http = _client(OutOfMemoryOnce(max_context=640))
    try:
        text = http.get("/metrics").text
        assert "treeflash_context_tokens 640.0" in text
        assert 'treeflash_memory_planned_bytes{part="weights"} 1000.0' in text
        assert 'treeflash_memory_planned_bytes{part="kv cache V"} 100.0' in text
        assert "treeflash_memory_planned_total_bytes 1300.0" in text
    finally:
        http.__exit__(None, None, None)
