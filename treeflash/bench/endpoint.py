"""An OpenAI-compatible server as a benchmark target (ours, llama.cpp, vLLM, ...).

Chat prompts go to /v1/chat/completions, raw prompts to /v1/completions, both with stream=true
and stream_options.include_usage. Time to first token is the arrival of the first chunk with
text; decode tokens/s is (completion_tokens - 1) over the time from that chunk to the last one,
with completion_tokens from the usage chunk (servers that send none: one token per text chunk,
marked `tokens_estimated`). Client-side times include the network and SSE framing, so compare
them with in-process figures on the same host only.
"""

from __future__ import annotations

import json
import time

from treeflash.data.prompts import BenchPrompt
from treeflash.bench.runner import BenchSettings, RunRecord
from treeflash.errors import TreeflashError


class EndpointError(TreeflashError):
    """The server refused a request or sent something that is not an OpenAI stream."""


def api_base(url: str) -> str:
    """'http://host:8000', '.../v1' or '.../v1/' -> 'http://host:8000/v1'."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class EndpointTarget:
    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, label: str = "endpoint",
                 timeout: float = 1800.0, client=None):
        import httpx

        self.base, self.label = api_base(url), label
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        import httpx

        try:
            r = self.client.get(f"{self.base}/models")
            r.raise_for_status()
            return r.json()["data"][0]["id"]
        except httpx.ConnectError as e:
            raise EndpointError(f"cannot connect to {self.base}: {e}") from None
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return "default"  # servers that serve one model ignore the name; --served-model overrides

    def body(self, prompt: BenchPrompt, settings: BenchSettings, max_tokens: int) -> tuple[str, dict]:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": settings.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if settings.temperature > 0:
            body["seed"] = settings.seed
        if settings.ignore_eos:
            body["ignore_eos"] = True  # a vLLM / llama.cpp extension
        if prompt.chat:
            return "/chat/completions", {**body, "messages": list(prompt.messages)}
        return "/completions", {**body, "prompt": prompt.text}

    def run(self, prompt: BenchPrompt, settings: BenchSettings, max_tokens: int) -> RunRecord:
        import httpx

        path, body = self.body(prompt, settings, max_tokens)
        usage, timings, finish = None, None, None
        first = last = None
        chunks = 0
        t0 = time.perf_counter()
        try:
            with self.client.stream("POST", self.base + path, json=body) as resp:
                if resp.status_code >= 400:
                    raise EndpointError(f"{self.base}{path}: HTTP {resp.status_code}: {resp.read().decode(errors='replace')[:500]}")
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue  # SSE comments, event names, keep-alives
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = _parse(data)
                    now = time.perf_counter()
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    timings = chunk.get("timings", timings)  # llama.cpp reports its own
                    for choice in chunk.get("choices") or []:
                        if _text(choice):
                            first = first if first is not None else now
                            last = now
                            chunks += 1
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                            last = last if last is not None else now
        except httpx.HTTPError as e:
            raise EndpointError(f"{self.base}{path}: {type(e).__name__}: {e}") from None
        if first is None:
            raise EndpointError(f"{self.base}{path}: the stream for {prompt.name} carried no text")
        extra: dict = {"api": path}
        if usage is None:
            extra["tokens_estimated"] = True
        else:
            extra["usage"] = usage
        if timings:
            extra["server_timings"] = timings
        tokens = int(usage.get("completion_tokens", chunks)) if usage else chunks
        prompt_tokens = int(usage.get("prompt_tokens", 0)) if usage else 0
        spec = _spec_from_usage(usage)
        return RunRecord(self.label, prompt.name, -1, -1, prompt_tokens, tokens, last - t0, first - t0, finish, spec, extra=extra)

    def describe(self) -> dict:
        return {"label": self.label, "kind": "endpoint", "url": self.base, "model": self.model}


def _parse(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise EndpointError(f"not a JSON stream chunk: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise EndpointError(f"not a JSON object: {data[:200]!r}")
    if "error" in chunk:
        raise EndpointError(f"the server reported an error mid-stream: {chunk['error']}")
    return chunk


def _text(choice: dict) -> str:
    delta = choice.get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or choice.get("text") or ""


def _spec_from_usage(usage: dict | None) -> dict | None:
    """Servers that report speculation statistics in usage (treeflash serve does) keep them."""
    if not usage:
        return None
    spec = usage.get("spec") or usage.get("treeflash")
    if isinstance(spec, dict) and "tau" in spec and "passes" in spec and "committed" in spec:
        return spec
    return None
