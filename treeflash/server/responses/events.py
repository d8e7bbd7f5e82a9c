"""One job's output parts -> OpenAI Responses stream events, and the fold into one Response.

`response_events` is the only producer: the streaming reply sends its events as SSE, the
non-streaming reply is the Response of the final event (`fold_response`), so the two can never
disagree. The stream: response.created, response.in_progress, then per output item (reasoning,
message, function_call, in the order the model wrote them) output_item.added, its deltas
(reasoning_text.delta; content_part.added, output_text.delta, output_text.done, content_part.done;
function_call_arguments.delta / .done), output_item.done; then response.completed, or
response.incomplete when max_output_tokens cut the output. Every event has a sequence_number.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from treeflash.server.errors import APIError
from treeflash.server.output import Call, Finish, Part, Reasoning, Text


@dataclass
class ResponseContext:
    id: str
    model: str
    input_tokens: int
    request: dict  # the request's echoed fields (instructions, tools, temperature, ...)
    count_tokens: Callable[[str], int]  # for output_tokens_details.reasoning_tokens
    on_done: Callable[[list[dict]], None] = lambda output: None  # gets the output items once the response ended
    created_at: int = field(default_factory=lambda: int(time.time()))


def error_event(e: APIError) -> dict:
    err = e.body()["error"]
    return {"type": "error", "code": err["code"], "message": err["message"], "param": err["param"], "sequence_number": 0}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Writer:
    """Builds the events and keeps the Response they describe."""

    def __init__(self, ctx: ResponseContext):
        self.ctx = ctx
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the item being written
        self.reasoning_text: list[str] = []

    def ev(self, kind: str, **fields) -> dict:
        out = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return out

    def response(self, status: str, usage: dict | None = None, incomplete: str | None = None) -> dict:
        return {"id": self.ctx.id, "object": "response", "created_at": self.ctx.created_at, "status": status, "error": None,
                "incomplete_details": {"reason": incomplete} if incomplete else None, "model": self.ctx.model,
                "output": [dict(i) for i in self.output], "usage": usage, **self.ctx.request}

    def close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output) - 1
        item["status"] = "completed"
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self.ev("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=[]),
                    self.ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=dict(part))]
        elif item["type"] == "reasoning":
            out.append(self.ev("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                               text=item["content"][0]["text"]))
        else:
            out.append(self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=item["arguments"]))
        out.append(self.ev("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def part(self, part: Part) -> list[dict]:
        kind = "reasoning" if isinstance(part, Reasoning) else "message" if isinstance(part, Text) else "function_call"
        out = []
        if self.open is None or self.open["type"] != kind or kind == "function_call":
            out += self.close()
            out += self.start(kind, part)
        item, index = self.open, len(self.output) - 1
        if isinstance(part, Reasoning):
            item["content"][0]["text"] += part.text
            self.reasoning_text.append(part.text)
            out.append(self.ev("response.reasoning_text.delta", item_id=item["id"], output_index=index, content_index=0,
                               delta=part.text))
        elif isinstance(part, Text):
            item["content"][0]["text"] += part.text
            out.append(self.ev("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                               delta=part.text, logprobs=[]))
        else:
            item["arguments"] = part.call.arguments
            out.append(self.ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                               delta=part.call.arguments))
        return out

    def start(self, kind: str, part: Part) -> list[dict]:
        if kind == "reasoning":
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        elif kind == "message":
            item = {"id": _new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        else:
            assert isinstance(part, Call)
            item = {"id": _new_id("fc"), "type": "function_call", "call_id": part.call.id, "name": part.call.name,
                    "arguments": "", "status": "in_progress"}
        self.output.append(item)
        self.open = item
        index = len(self.output) - 1
        out = [self.ev("response.output_item.added", output_index=index, item=_copy(item))]
        if kind == "message":
            text_part = {"type": "output_text", "text": "", "annotations": []}
            item["content"].append(text_part)
            out.append(self.ev("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                               part=dict(text_part)))
        elif kind == "reasoning":
            item["content"].append({"type": "reasoning_text", "text": ""})
        return out


def _copy(item: dict) -> dict:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


async def response_events(parts: AsyncIterator[Part | Finish], ctx: ResponseContext) -> AsyncIterator[dict]:
    w = _Writer(ctx)
    yield w.ev("response.created", response=w.response("in_progress"))
    yield w.ev("response.in_progress", response=w.response("in_progress"))
    async for part in parts:
        if isinstance(part, Finish):
            for ev in w.close():
                yield ev
            output_tokens = part.usage.completion_tokens if part.usage else 0
            reasoning = "".join(w.reasoning_text)
            cached = part.usage.cached_tokens if part.usage else 0
            usage = {"input_tokens": ctx.input_tokens, "input_tokens_details": {"cached_tokens": cached},
                     "output_tokens": output_tokens,
                     "output_tokens_details": {"reasoning_tokens": min(ctx.count_tokens(reasoning), output_tokens) if reasoning else 0},
                     "total_tokens": ctx.input_tokens + output_tokens}
            ctx.on_done(w.output)
            if part.reason == "length":
                yield w.ev("response.incomplete", response=w.response("incomplete", usage, "max_output_tokens"))
            else:
                yield w.ev("response.completed", response=w.response("completed", usage))
            return
        for ev in w.part(part):
            yield ev


async def fold_response(events: AsyncIterator[dict]) -> dict:
    """The non-streaming Response: the one the final event carries."""
    final = None
    async for ev in events:
        if ev["type"] in ("response.completed", "response.incomplete"):
            final = ev["response"]
    assert final is not None, "response_events always ends with response.completed or response.incomplete"
    return final
