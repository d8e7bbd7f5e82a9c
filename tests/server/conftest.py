"""Two live servers, each started once for the whole tests/server session: one on the default model
(`server`), one on the toy engine with slow steps and scripted outputs (`toy`)."""

import time

import httpx
import openai
import pytest
from openai import OpenAI

from tests.server.live import CONTEXT, KEY, TOY, LiveServer, toy_chat_body


@pytest.fixture(scope="session")
def server():
    s = LiveServer(["serve", "--draft", "ngram", "--api-key", KEY, "--max-context", str(CONTEXT), "--threads", "1"]).wait_ready(900)
    yield s
    code = s.stop()
    assert code in (0, 130), s.output()
    assert "Traceback" not in s.output(), s.output()


@pytest.fixture(scope="session")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600) as c:
        yield c


@pytest.fixture(scope="session")
def toy():
    """The toy server: --max-queue 1 (through the real `treeflash serve` parser), 0.05 s per step, a 3 s load.

    While it loads, one request through raw httpx and one through the openai client are kept
    (`early_chat`, `early_openai`): both must be 503s."""
    server = LiveServer(["--load-delay", "3", "--step-delay", "0.05", "--max-queue", "1"], module=TOY)
    deadline = time.monotonic() + 120
    early = None
    while time.monotonic() < deadline and early is None:
        try:
            early = httpx.post(server.url + "/v1/chat/completions", json=toy_chat_body(), timeout=5)
        except httpx.TransportError:
            time.sleep(0.05)
    server.early_chat = early
    try:
        server.early_openai = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    except openai.APIStatusError as e:
        server.early_openai = e
    server.wait_ready(120)
    yield server
    server.stop()
    assert "unhandled error" not in server.output(), server.output()  # every failure went through the error envelope


@pytest.fixture(scope="session")
def toy_client(toy):
    return OpenAI(base_url=toy.url + "/v1", api_key="none", max_retries=0, timeout=60)
