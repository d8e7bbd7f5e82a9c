"""Tool calls in the Qwen / Hermes format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

`ToolCallParser` works on a text stream: it emits content as soon as the text cannot be the start
of a `<tool_call>` tag, and one complete `ParsedToolCall` per closed block. A block whose JSON does
not parse (or has no name) is given back as plain content, so no model output is ever lost.
Whitespace between and around tool calls is dropped, as the template puts it there, not the model.

Also here: the other direction, tool definitions and past tool calls rendered for chat templates.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

START, END = "<tool_call>", "</tool_call>"


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as a string (what OpenAI clients expect)
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])


def parse_block(body: str) -> ParsedToolCall | None:
    """The JSON between the tags -> a tool call, or None if it is not one."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments already encoded
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ParsedToolCall(obj["name"], json.dumps({"input": args}, ensure_ascii=False))
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser:
    def __init__(self) -> None:
        self.buf = ""  # unprocessed text: a possible tag start, pending whitespace, or an open block
        self.inside = False
        self.calls: list[ParsedToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        """Returns (content safe to emit, tool calls completed by this text)."""
        self.buf += text
        out, calls = [], []
        while True:
            if self.inside:
                end = self.buf.find(END)
                if end < 0:
                    break
                body, self.buf, self.inside = self.buf[:end], self.buf[end + len(END):], False
                call = parse_block(body)
                if call is None:
                    out.append(START + body + END)
                else:
                    calls.append(call)
                continue
            start = self.buf.find(START)
            if start >= 0:
                before = self.buf[:start].rstrip()  # whitespace right before a tag is layout: drop it
                if before:
                    out.append(before)
                self.buf, self.inside = self.buf[start + len(START):], True
                continue
            keep = partial_tail(self.buf, START)
            emit, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep:]
            stripped = emit.rstrip()
            if stripped:  # hold trailing whitespace: it may precede a tag
                out.append(emit[: len(stripped)])
                self.buf = emit[len(stripped):] + self.buf
            else:
                self.buf = emit + self.buf
            break
        self.calls.extend(calls)
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ParsedToolCall]]:
        """End of the stream: an unclosed block is tried as a call (the model may stop before the tag)."""
        rest, self.buf = self.buf, ""
        if self.inside:
            self.inside = False
            call = parse_block(rest)
            if call is not None:
                self.calls.append(call)
                return "", [call]
            return START + rest, []
        if self.calls and not rest.strip():
            return "", []
        return rest, []


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """The whole text at once (the same parser, fed once)."""
    p = ToolCallParser()
    content, calls = p.feed(text)
    more, late = p.flush()
    return content + more, calls + late


def partial_tail(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


# -- rendering tools and past tool calls for chat templates --

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """The Hermes tools block, for templates that do not render `tools` themselves."""
    return HERMES_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A past call as the model would have written it, for templates that ignore `tool_calls`."""
    return f"{START}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{END}"
