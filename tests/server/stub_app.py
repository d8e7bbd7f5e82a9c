"""The app in-process over StubEngine (tests/server/scripted.py), for tests through the official
clients that need no model: the client's own httpx.Client is the app's TestClient."""

from __future__ import annotations

import time
from contextlib import contextmanager

from fastapi.testclient import TestClient

from tests.server.scripted import StubEngine
from treeflash.server.app import ServerConfig, create_app

KEY = "stub-key"


@contextmanager
def stub_client(max_context: int = 1024, **config):
    """A TestClient of a ready app serving model "toy" with API key KEY."""
    app = create_app(ServerConfig("toy", api_key=KEY, **config), lambda: StubEngine(max_context=max_context))
    with TestClient(app) as tc:
        for _ in range(500):
            if tc.get("/health").status_code == 200:
                break
            time.sleep(0.01)
        yield tc
