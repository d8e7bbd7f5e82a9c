"""The endpoint client against a tiny scripted OpenAI-style SSE server on 127.0.0.1."""

import json

import pytest

from tests.bench.fake_openai import FIRST_DELAY, STEP, Handler
from treeflash.bench.endpoint import EndpointError, EndpointTarget, api_base
from treeflash.data.prompts import BenchPrompt, user
from treeflash.bench.runner import BenchSettings
from treeflash.cli.main import main


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
