"""One live server on the default model for the whole tests/server session (it loads once)."""

import httpx
import pytest
from openai import OpenAI

from tests.server.live import CONTEXT, KEY, LiveServer


@pytest.fixture(scope="session")
def server():
    s = LiveServer(["serve", "--draft", "ngram", "--api-key", KEY, "--max-context", str(CONTEXT)]).wait_ready(900)
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
