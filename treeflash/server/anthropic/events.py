"""One job's output parts -> Anthropic Messages stream events, and the fold into one Message.

`message_events` is the only producer: the streaming reply sends its events as SSE (named by
their `type`), the non-streaming reply is `fold_message` over the very same events. The stream:
message_start, a ping, then per content block (thinking, text, tool_use, in the order the model
wrote them) content_block_start / content_block_delta (thinking_delta + signature_delta,
text_delta, input_json_delta) / content_block_stop, then message_delta with the stop_reason and
the usage, then message_stop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from treeflash.server.errors import APIError
from treeflash.server.output import Call, Finish, Part, Reasoning, Text

# thinking blocks carry a signature in Anthropic's API (proof the block came from the model). Ours
# are the local model's own text, unsigned; clients treat the field as opaque.
SIGNATURE = ""


@dataclass(frozen=True)
class MessageContext:
    id: str
    model: str
    input_tokens: int


def stop_reason(finish: Finish) -> str:
    if finish.reason == "length":
        return "max_tokens"
    if finish.stop_string is not None:
        return "stop_sequence"
    return "tool_use" if finish.num_calls else "end_turn"


def _usage(ctx: MessageContext, output_tokens: int, cached_tokens: int = 0) -> dict:
    """Anthropic's input_tokens leave out the cache reads: input + cache_read is the whole prompt.
    (message_start is sent before the prefix cache is looked up: its usage counts no reads.)"""
    return {"input_tokens": ctx.input_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def error_event(e: APIError) -> dict:
    return e.anthropic_body()


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


async def message_events(parts: AsyncIterator[Part | Finish], ctx: MessageContext) -> AsyncIterator[dict]:
    yield {"type": "message_start", "message": {"id": ctx.id, "type": "message", "role": "assistant", "model": ctx.model,
                                                "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(ctx, 0)}}
    yield {"type": "ping"}
    index, open_kind = -1, None

    def close() -> list[dict]:
        out = []
        if open_kind == "thinking":
            out.append({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": SIGNATURE}})
        if open_kind is not None:
            out.append({"type": "content_block_stop", "index": index})
        return out

    async for part in parts:
        if isinstance(part, Finish):
            for ev in close():
                yield ev
            output_tokens = part.usage.completion_tokens if part.usage else 0
            cached = part.usage.cached_tokens if part.usage else 0
            yield {"type": "message_delta", "delta": {"stop_reason": stop_reason(part), "stop_sequence": part.stop_string},
                   "usage": _usage(ctx, output_tokens, cached)}
            yield {"type": "message_stop"}
            return
        kind = "thinking" if isinstance(part, Reasoning) else "text" if isinstance(part, Text) else "tool_use"
        if kind != open_kind or kind == "tool_use":
            for ev in close():
                yield ev
            index, open_kind = index + 1, kind
            if isinstance(part, Call):
                block = {"type": "tool_use", "id": tool_use_id(part.call.id), "name": part.call.name, "input": {}}
            else:
                block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
            yield {"type": "content_block_start", "index": index, "content_block": block}
        if isinstance(part, Reasoning):
            delta = {"type": "thinking_delta", "thinking": part.text}
        elif isinstance(part, Text):
            delta = {"type": "text_delta", "text": part.text}
        else:
            delta = {"type": "input_json_delta", "partial_json": part.call.arguments}
        yield {"type": "content_block_delta", "index": index, "delta": delta}


async def fold_message(events: AsyncIterator[dict]) -> dict:
    """The non-streaming Message: the stream's blocks with their deltas applied."""
    message: dict | None = None
    blocks: list[dict] = []
    json_parts: dict[int, list[str]] = {}
    async for ev in events:
        kind = ev["type"]
        if kind == "message_start":
            message = dict(ev["message"])
        elif kind == "content_block_start":
            blocks.append(dict(ev["content_block"]))
        elif kind == "content_block_delta":
            block, d = blocks[ev["index"]], ev["delta"]
            if d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                block["signature"] = d["signature"]
            else:
                json_parts.setdefault(ev["index"], []).append(d["partial_json"])
        elif kind == "message_delta":
            assert message is not None, "message_start comes first"
            message.update(ev["delta"])
            message["usage"] = ev["usage"]
    assert message is not None, "message_events always starts with message_start"
    for i, parts in json_parts.items():
        blocks[i]["input"] = json.loads("".join(parts))
    message["content"] = blocks
    return message
