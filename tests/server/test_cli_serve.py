"""`treeflash serve` flags through the real argument parser: the app is built from the parsed
arguments exactly as `run` builds it (server_config + create_app), over a pure-Python stub engine,
and driven in process (no port) through the official openai client."""

import threading
import time
from contextlib import contextmanager

import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from tests.server.scripted import StubEngine
from treeflash.cli.main import build_parser, main
from treeflash.cli.serve import DEFAULT_NAME, run, server_config
from treeflash.errors import InvalidRequestError
from treeflash.server.app import create_app

HI = [{"role": "user", "content": "hi"}]


def parse(*flags):
    args = build_parser().parse_args(["serve", *flags])
    assert args.func is run
    return args


@contextmanager
def served(*flags, engine=None):
    """(openai client, TestClient, app) for the app these flags describe, once its engine is ready."""
    engine = engine or StubEngine()
    app = create_app(server_config(parse(*flags)), lambda: engine)
    with TestClient(app, base_url="http://127.0.0.1:8000") as http:  # the Host a loopback server answers (server/hosts.py)
        for _ in range(200):
            if http.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        yield OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="k", http_client=http, max_retries=0), http, app


def test_served_model_name_is_the_only_name_served():
    with served("--served-model-name", "team/coder-7b") as (client, http, _):
        assert [m.id for m in client.models.list().data] == ["team/coder-7b"]
        assert client.models.retrieve("team/coder-7b").id == "team/coder-7b"  # a name with a slash, in the path
        assert http.get("/health").json()["model"] == "team/coder-7b"
        r = client.chat.completions.create(model="team/coder-7b", messages=HI, max_tokens=4)
        assert r.model == "team/coder-7b" and r.choices[0].message.content == "plai"
        with pytest.raises(openai.NotFoundError, match="this server serves 'team/coder-7b'") as e:
            client.chat.completions.create(model=DEFAULT_NAME, messages=HI, max_tokens=4)
        assert e.value.code == "model_not_found" and e.value.param == "model"


def test_served_model_name_defaults():
    assert server_config(parse()).served_model_name == DEFAULT_NAME
    assert server_config(parse("--model", "/m/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf")).served_model_name == "Qwen2.5-0.5B-Instruct-Q4_K_M"
    assert server_config(parse("--model", "/m/Qwen3-0.6B/")).served_model_name == "Qwen3-0.6B"
    assert server_config(parse("--model", "/m/x.gguf", "--served-model-name", "y")).served_model_name == "y"


def test_agent_and_hardening_flags():
    config = server_config(parse("--default-max-tokens", "100", "--max-tokens-cap", "200", "--responses-store", "0",
                                 "--body-timeout", "2.5", "--allowed-hosts", "my.lan, box.local", "--host", "127.0.0.1"))
    assert (config.limits.default_max_tokens, config.limits.max_tokens) == (100, 200)
    assert config.responses_store == 0 and config.body_timeout_s == 2.5
    assert config.hosts.allowed == ("my.lan", "box.local") and config.hosts.bound == "127.0.0.1"
    assert server_config(parse()).limits.max_tokens is None and server_config(parse()).hosts.checks
    for flags in (("--default-max-tokens", "0"), ("--max-tokens-cap", "-1"), ("--responses-store", "-1"), ("--body-timeout", "0")):
        with pytest.raises(InvalidRequestError, match=flags[0]):
            server_config(parse(*flags))
    with served("--host", "127.0.0.1") as (_, http, _app):
        assert http.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 403


@pytest.mark.parametrize("max_queue", [1, 2])
def test_max_queue_bounds_the_waiting_requests(max_queue):
    engine = StubEngine(step_delay=0.02, default_text="word " * 60)  # 60 events: about 1.2 s per request
    with served("--max-queue", str(max_queue), engine=engine) as (client, http, app):
        worker = app.state.treeflash.worker
        statuses = []

        def one():
            statuses.append(http.post("/v1/chat/completions", json={"messages": HI}).status_code)

        threads = [threading.Thread(target=one) for _ in range(max_queue + 1)]
        for k, t in enumerate(threads):  # one running, then max_queue waiting
            t.start()
            for _ in range(500):
                if worker.busy and worker.queue_depth == k:
                    break
                time.sleep(0.005)
            assert worker.busy and worker.queue_depth == k
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(messages=HI, model=DEFAULT_NAME, max_tokens=2)
        waiting = "1 request waiting" if max_queue == 1 else f"{max_queue} requests waiting"
        assert e.value.status_code == 429 and f"the queue is full ({waiting}, the limit set by --max-queue)" in e.value.message
        for t in threads:
            t.join(30)
        assert statuses == [200] * (max_queue + 1)  # the refusal cost nobody else anything
        assert client.chat.completions.create(messages=HI, model=DEFAULT_NAME, max_tokens=2).choices[0].finish_reason == "length"


def test_bad_flag_values_fail_before_binding_or_loading(capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("serve() reached: the flags were not checked first")

    monkeypatch.setattr("treeflash.cli.serve.serve", never)
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "error: --max-queue must be >= 1, got 0" in capsys.readouterr().err
    assert main(["serve", "--served-model-name", ""]) == 2
    assert "error: --served-model-name must be non-empty" in capsys.readouterr().err
