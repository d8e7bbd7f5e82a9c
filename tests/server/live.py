"""Start a real server process on 127.0.0.1 with a free port, wait for it, stop it by its pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]

# the session's server on the default model (conftest.py)
KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"
CONTEXT = 2048

# the session's toy server (conftest.py, tests/server/toy_server.py)
TOY = "tests.server.toy_server"


def toy_chat_body(max_tokens=8, stream=False, **kw):
    return {"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream,
            "temperature": 0, "ignore_eos": True, **kw}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, args: list[str], module: str = "treeflash.cli.main"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="treeflash-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", module] + args + ["--port", str(self.port)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.health_seen: list[int] = []  # statuses /health gave while we waited

    def wait_ready(self, timeout: float = 600.0) -> "LiveServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
                self.health_seen.append(status)
                if status == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
