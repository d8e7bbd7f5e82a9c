"""docker/: what the images do, checked without Docker (no base image can be pulled here).

The Dockerfiles' instructions are read and held to the contract (CUDA runtime base, docker/install.sh
as the build, a non-root user, the /cache volume, /health as the HEALTHCHECK, the serve entrypoint);
docker/install.sh runs outside Docker into a temporary prefix (its dependencies pre-linked, so the
run is offline: test_wheel proves their declaration); and the image's ENTRYPOINT, taken from the
Dockerfile, runs from that prefix on the CPU: /health, the HEALTHCHECK script, one chat request,
/metrics, a clean stop on SIGTERM.
"""

import importlib.metadata as md
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.wheel import fresh_venv, link_distributions, runtime_closure, wheel_requirements
from tests.models.test_loaders import random_hf, write_gguf

pytestmark = pytest.mark.deploy
ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
ENTRYPOINT = ["treeflash", "serve", "--host", "0.0.0.0", "--port", "8000"]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def one(instrs, word) -> str:
    found = [rest for w, rest in instrs if w == word]
    assert len(found) == 1, (word, found)
    return found[0]


@pytest.mark.parametrize("name, flavor", [("Dockerfile", "cuda"), ("Dockerfile.cpu", "cpu")])
def test_dockerfile_contract(name, flavor):
    instrs = instructions(DOCKER / name)
    assert json.loads(one(instrs, "ENTRYPOINT")) == ENTRYPOINT
    assert json.loads(one(instrs, "CMD")) == []  # `docker run IMAGE --model ...` appends serve flags
    assert one(instrs, "USER") == "1000:1000"
    assert json.loads(one(instrs, "VOLUME")) == ["/cache"]
    env = " ".join(rest for w, rest in instrs if w == "ENV")
    assert "HF_HOME=/cache/huggingface" in env and "TREEFLASH_CACHE=/cache/treeflash" in env
    health = one(instrs, "HEALTHCHECK")
    assert "healthcheck.py" in health and "http://127.0.0.1:8000/health" in health
    assert one(instrs, "EXPOSE") == "8000"
    runs = [rest for w, rest in instrs if w == "RUN"]
    assert any(f"install.sh /opt/treeflash {flavor} /src" in r for r in runs)
    assert any("useradd" in r and "--uid 1000" in r for r in runs)
    base = [rest for w, rest in instrs if w == "ARG" and rest.startswith(("CUDA_IMAGE=", "BASE_IMAGE="))]
    assert base and ("nvidia/cuda:" in base[0] and "-runtime-" in base[0] if flavor == "cuda" else "python:3.12" in base[0])
    for w, rest in instrs:  # every COPY source exists and the build context lets it through
        if w == "COPY":
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), src
                assert re.search(rf"^!{re.escape(src.split('/')[0])}/?$", (ROOT / ".dockerignore").read_text(), re.M), src


def test_install_script_refuses_bad_arguments():
    r = subprocess.run(["bash", str(DOCKER / "install.sh"), "/tmp/x", "rocm", "."], capture_output=True, text=True)
    assert r.returncode == 2 and "usage:" in r.stderr


@pytest.fixture(scope="module")
def prefix(tmp_path_factory, wheel):
    """docker/install.sh PREFIX cpu WHEEL, outside Docker: the prefix already sees pip and the runtime
    dependencies (as a base image with PyTorch would), so pip only resolves them and installs treeflash."""
    prefix = tmp_path_factory.mktemp("image") / "opt-treeflash"
    provided = runtime_closure(wheel_requirements(wheel)) | {"pip": md.distribution("pip")}  # pip: no ensurepip run
    link_distributions(provided, fresh_venv(prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {"PIP_NO_INDEX": "1"}
    r = subprocess.run(["bash", str(DOCKER / "install.sh"), str(prefix), "cpu", str(wheel)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"treeflash is installed in {prefix}" in r.stdout
    return prefix


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_env(prefix: Path, cache: Path | None) -> dict[str, str]:
    """The image's environment: its PATH first, its caches (None: the user's own, e.g. the default model's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{prefix / 'bin'}:{env['PATH']}"
    if cache is not None:
        env |= {"HF_HOME": str(cache / "huggingface"), "TREEFLASH_CACHE": str(cache / "treeflash")}
    return env


def run_entrypoint(prefix: Path, extra: list[str], cache: Path | None, cwd: Path):
    """The Dockerfile's ENTRYPOINT as written, on 127.0.0.1 and a free port instead of 0.0.0.0:8000."""
    command = json.loads(one(instructions(DOCKER / "Dockerfile"), "ENTRYPOINT"))
    port = free_port()
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    proc = subprocess.Popen(command + extra, env=image_env(prefix, cache), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc, url: str, timeout: float = 240) -> list[int]:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            status = httpx.get(url + "/health", timeout=5).status_code
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        seen.append(status)
        if status == 200:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"/health never answered 200: {seen[-5:]}")


def check_serving(prefix: Path, proc, url: str, model: str) -> None:
    seen = wait_ready(proc, url)
    assert set(seen) <= {503, 200}, seen  # 503 while loading, then 200
    health = [str(prefix / "bin" / "python"), str(DOCKER / "healthcheck.py")]
    assert subprocess.run(health + [url + "/health"], timeout=30).returncode == 0
    assert subprocess.run(health + [f"http://127.0.0.1:{free_port()}/health"], capture_output=True, timeout=30).returncode == 1
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["object"] == "chat.completion" and isinstance(reply["choices"][0]["message"]["content"], str)
    assert 0 < reply["usage"]["completion_tokens"] <= 8
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert "vllm:num_requests_waiting" in metrics and "vllm:kv_cache_usage_perc" in metrics
    proc.send_signal(signal.SIGTERM)  # what `docker stop` sends
    rc = proc.wait(timeout=60)
    log = proc.stdout.read()
    # a graceful stop: uvicorn shuts the app down, then re-raises the signal it handled (exit status 143 in a shell)
    assert rc in (0, -signal.SIGTERM) and "Application shutdown complete" in log, (rc, log[-2000:])


def test_entrypoint_serves_a_model_from_the_cache_volume(prefix, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf", random_hf("llama"))
    proc, url = run_entrypoint(prefix, ["--model", str(model)], tmp_path / "cache", tmp_path)
    try:
        check_serving(prefix, proc, url, "tiny")
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_entrypoint_as_is_serves_the_embedded_default_model(prefix, tmp_path):
    """No flag added: `treeflash serve --host 0.0.0.0 --port 8000` with the embedded default (host and port
    moved to 127.0.0.1 and a free port; the default model from the user's cache, fetched once)."""
    proc, url = run_entrypoint(prefix, [], None, tmp_path)
    try:
        check_serving(prefix, proc, url, "SmolLM2-135M-Instruct")
    finally:
        if proc.poll() is None:
            proc.kill()
