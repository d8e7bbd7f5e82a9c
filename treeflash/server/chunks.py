"""One job's events -> OpenAI chunk dicts, and the folds that turn chunks into one reply.

`chat_chunks` / `completion_chunks` are the only producers of output: the streaming reply sends
their chunks as SSE, the non-streaming reply is `fold_chat` / `fold_completion` over the very
same chunks, so the two can never disagree. Per choice: a first chunk with the role (chat), any
number of deltas (one engine step may commit several tokens), exactly one finish_reason; then,
when usage is wanted, one chunk with empty choices and the usage.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from treeflash.engine.request import TokenLogprob
from treeflash.server.output import OutputSplitter
from treeflash.server.tools import ToolCallParser
from treeflash.server.worker import Job

MIN_LOGPROB = -9999.0  # -inf is not JSON; OpenAI reports this floor instead


@dataclass(frozen=True)
class ReplyContext:
    id: str
    created: int
    model: str
    prompt_tokens: int  # counted once per prompt, not once per choice
    include_usage: bool


class TokenText:
    """Token id -> its text, for logprobs; a lock because the tokenizer is shared with request threads."""

    def __init__(self, tokenizer, lock: threading.Lock):
        self.tok = tokenizer
        self.lock = lock
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            with self.lock:
                text = self.cache[token_id] = self.tok.decode([token_id], skip_special_tokens=False)
        return text


def _lp(x: float) -> float:
    return max(float(x), MIN_LOGPROB) if x == x else MIN_LOGPROB


class _ChatChoice:
    """One choice's text as chat deltas; the split itself is the shared OutputSplitter."""

    def __init__(self, in_think: bool, tool_parser: Callable[[], ToolCallParser] | None):
        self.splitter = OutputSplitter(in_think, tool_parser)

    @property
    def num_calls(self) -> int:
        return self.splitter.num_calls

    def delta(self, text: str, final: bool) -> dict:
        first = self.splitter.num_calls
        reasoning, content, calls = self.splitter.feed(text, final)
        delta: dict = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [
                {"index": first + k, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for k, c in enumerate(calls)
            ]
        return delta


def _usage(ctx: ReplyContext, completion_tokens: int, cached_tokens: int) -> dict:
    """cached_tokens: prompt tokens the prefix cache resumed (the first choice's; the prompt is counted once)."""
    return {"prompt_tokens": ctx.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": ctx.prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


async def chat_chunks(job: Job, ctx: ReplyContext, token_text: TokenText, in_think: bool,
                      tool_parser: Callable[[], ToolCallParser] | None = None) -> AsyncIterator[dict]:
    """tool_parser: a new ToolCallParser per choice (None: tool calls are not parsed). finish_reason is
    "tool_calls" when a call was parsed; a malformed call stays content, with the engine's reason."""
    base = {"id": ctx.id, "object": "chat.completion.chunk", "created": ctx.created, "model": ctx.model}
    choices: dict[int, _ChatChoice] = {}
    completion_tokens, cached = 0, None
    async for index, ev in job.events():
        choice = choices.get(index)
        if choice is None:
            choice = choices[index] = _ChatChoice(in_think, tool_parser)
            yield {**base, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}
        final = ev.finish_reason is not None
        delta = choice.delta(ev.text, final)
        logprobs = {"content": [_chat_logprob(lp, token_text) for lp in ev.logprobs]} if ev.logprobs else None
        finish = None
        if final:
            finish = "tool_calls" if choice.num_calls and ev.finish_reason == "stop" else ev.finish_reason
            completion_tokens += ev.usage.completion_tokens if ev.usage else 0
            cached = cached if cached is not None or ev.usage is None else ev.usage.cached_tokens
        if delta or logprobs or final:
            yield {**base, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
    if ctx.include_usage:
        yield {**base, "choices": [], "usage": _usage(ctx, completion_tokens, cached or 0)}


def _chat_logprob(lp: TokenLogprob, token_text: TokenText) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}

    return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, l) for t, l in lp.top]}


async def completion_chunks(job: Job, ctx: ReplyContext, token_text: TokenText) -> AsyncIterator[dict]:
    base = {"id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model}
    offsets: dict[int, int] = {}  # text_offset so far, per choice (offsets count from the output's start)
    completion_tokens, cached = 0, None
    async for index, ev in job.events():
        final = ev.finish_reason is not None
        logprobs = None
        if ev.logprobs is not None:
            logprobs, offsets[index] = _completion_logprobs(ev.logprobs, token_text, offsets.get(index, 0))
        if final:
            completion_tokens += ev.usage.completion_tokens if ev.usage else 0
            cached = cached if cached is not None or ev.usage is None else ev.usage.cached_tokens
        if ev.text or logprobs or final:
            choice = {"index": index, "text": ev.text, "logprobs": logprobs, "finish_reason": ev.finish_reason}
            yield {**base, "choices": [choice]}
    if ctx.include_usage:
        yield {**base, "choices": [], "usage": _usage(ctx, completion_tokens, cached or 0)}


def _completion_logprobs(lps: list[TokenLogprob], token_text: TokenText, offset: int) -> tuple[dict, int]:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in lps:
        text = token_text(lp.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(lp.logprob))
        top = {token_text(t): _lp(l) for t, l in lp.top}
        top.setdefault(text, _lp(lp.logprob))  # OpenAI's completions always list the sampled token (up to logprobs + 1 entries)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


# -- folds: the non-streaming replies --

async def fold_chat(chunks: AsyncIterator[dict]) -> dict:
    reply, choices, usage = None, {}, None
    async for chunk in chunks:
        reply = reply or chunk
        usage = chunk.get("usage", usage)
        for c in chunk["choices"]:
            acc = choices.setdefault(c["index"], {"content": [], "reasoning": [], "calls": {}, "logprobs": None, "finish": None})
            d = c["delta"]
            acc["content"].append(d.get("content") or "")
            acc["reasoning"].append(d.get("reasoning_content") or "")
            for call in d.get("tool_calls") or []:
                prev = acc["calls"].get(call["index"])
                if prev is None:
                    acc["calls"][call["index"]] = {"id": call["id"], "type": "function", "function": dict(call["function"])}
                else:
                    prev["function"]["arguments"] += call["function"].get("arguments", "")
            if c.get("logprobs") is not None:
                acc["logprobs"] = acc["logprobs"] or {"content": []}
                acc["logprobs"]["content"].extend(c["logprobs"]["content"])
            acc["finish"] = c["finish_reason"] or acc["finish"]
    assert reply is not None, "a job always yields at least one chunk"
    out = []
    for index in sorted(choices):
        acc = choices[index]
        content = "".join(acc["content"])
        message: dict = {"role": "assistant", "content": content if content or not acc["calls"] else None}
        reasoning = "".join(acc["reasoning"])
        if reasoning:
            message["reasoning_content"] = reasoning
        if acc["calls"]:
            message["tool_calls"] = [acc["calls"][k] for k in sorted(acc["calls"])]
        out.append({"index": index, "message": message, "logprobs": acc["logprobs"], "finish_reason": acc["finish"]})
    return {"id": reply["id"], "object": "chat.completion", "created": reply["created"], "model": reply["model"],
            "choices": out, "usage": usage}


async def fold_completion(chunks: AsyncIterator[dict]) -> dict:
    reply, choices, usage = None, {}, None
    async for chunk in chunks:
        reply = reply or chunk
        usage = chunk.get("usage", usage)
        for c in chunk["choices"]:
            acc = choices.setdefault(c["index"], {"text": [], "logprobs": None, "finish": None})
            acc["text"].append(c["text"])
            if c["logprobs"] is not None:
                acc["logprobs"] = acc["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                for key, values in c["logprobs"].items():
                    acc["logprobs"][key].extend(values)
            acc["finish"] = c["finish_reason"] or acc["finish"]
    assert reply is not None, "a job always yields at least one chunk"
    out = [{"index": i, "text": "".join(choices[i]["text"]), "logprobs": choices[i]["logprobs"], "finish_reason": choices[i]["finish"]}
           for i in sorted(choices)]
    return {"id": reply["id"], "object": "text_completion", "created": reply["created"], "model": reply["model"],
            "choices": out, "usage": usage}
