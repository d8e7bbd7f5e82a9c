"""Prefix-cache hits as each API reports them, in-process over the toy engine (a random model,
the real Engine, --prefix-cache-mb on): chat and completions `usage.prompt_tokens_details.cached_tokens`,
Anthropic `cache_read_input_tokens` (input_tokens then counts the rest), Responses
`usage.input_tokens_details.cached_tokens`, and the total in /metrics; outputs unchanged."""

import time

import pytest
from fastapi.testclient import TestClient

from tests.server.toy_server import make_engine
from treeflash.server.app import ServerConfig, create_app

SYSTEM = "You are a careful assistant. " * 8


@pytest.fixture(scope="module")
def app():
    app = create_app(ServerConfig("toy"), lambda: make_engine(None, 0.0, 0.0, 1024, prefix_cache_mb=16))
    with TestClient(app) as c:
        for _ in range(3000):
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        yield c


def chat(c, text, **kw):
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}], "max_tokens": 4,
            "temperature": 0, **kw}
    return c.post("/v1/chat/completions", json=body).json()


def test_hits_are_reported_by_every_api(app):
    first = chat(app, "first question")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = chat(app, "first question")
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == again["usage"]["prompt_tokens"] - 1  # all but the last token, which is prefilled for its logits
    other = chat(app, "another question")  # shares the system turn
    assert 0 < other["usage"]["prompt_tokens_details"]["cached_tokens"] < other["usage"]["prompt_tokens"] - 5

    msg = {"model": "toy", "max_tokens": 4, "system": SYSTEM, "messages": [{"role": "user", "content": "another question"}],
           "temperature": 0}
    m = app.post("/v1/messages", json=msg).json()["usage"]
    assert m["cache_read_input_tokens"] > 0 and m["input_tokens"] + m["cache_read_input_tokens"] == other["usage"]["prompt_tokens"]

    r = app.post("/v1/responses", json={"model": "toy", "instructions": SYSTEM, "input": "another question", "max_output_tokens": 4,
                                        "temperature": 0}).json()["usage"]
    assert r["input_tokens_details"]["cached_tokens"] == r["input_tokens"] - 1

    comp = app.post("/v1/completions", json={"prompt": "plain text prompt", "max_tokens": 3, "temperature": 0}).json()
    assert comp["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no shared start with the chat turns
    metrics = app.get("/metrics").text
    line = next(l for l in metrics.splitlines() if l.startswith("treeflash_prefix_cache_hit_tokens_total"))
    assert float(line.split()[-1]) >= cached + m["cache_read_input_tokens"]
