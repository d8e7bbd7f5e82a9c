"""In-process checks of the app's edges, no model needed: FastAPI's own 422 becomes a 400 in the
OpenAI envelope, unknown routes are 404s in the envelope, a failed load is a 503 with the reason."""

from fastapi.testclient import TestClient

from treeflash.server.app import ServerConfig, create_app


def failing_load():
    raise RuntimeError("no weights here")


def make_client(**config):
    app = create_app(ServerConfig("m", **config), failing_load)

    @app.get("/typed")
    async def typed(x: int):  # a route with FastAPI-validated parameters
        return {"x": x}

    return TestClient(app)


def test_fastapi_validation_422_becomes_400_envelope():
    with make_client() as c:
        r = c.get("/typed", params={"x": "not-a-number"})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "query.x" in err["message"]
        assert c.get("/typed", params={"x": "3"}).json() == {"x": 3}


def test_unknown_route_and_failed_load():
    with make_client() as c:
        r = c.get("/v2/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        for _ in range(100):
            health = c.get("/health")
            if health.json()["error"]["code"] != "loading":
                break
        assert health.status_code == 503 and "no weights here" in health.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and "no weights here" in r.json()["error"]["message"]


def test_api_key_guards_everything_but_probes():
    with make_client(api_key="k") as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
        assert c.get("/metrics").status_code == 200 and c.get("/health").status_code == 503
        r = c.post("/v1/completions", content=b"x" * (5 << 20), headers={"Authorization": "Bearer k"})
        assert r.status_code == 503  # not ready comes first; the body limit is checked once a model is there


def test_oversized_headers_get_431_before_anything_else():
    with make_client(api_key="k") as c:
        for headers in ({"X-Junk": "a" * (100 << 10)}, {f"X-H{i}": "b" * 60 for i in range(1200)}):
            r = c.get("/health", headers=headers)
            assert r.status_code == 431, r.text[:200]
            err = r.json()["error"]
            assert err["code"] == "request_header_fields_too_large" and "the limit is 65536 bytes" in err["message"]
        assert c.get("/health", headers={"X-Junk": "a" * (60 << 10)}).status_code == 503  # under the limit: served (loading failed)
