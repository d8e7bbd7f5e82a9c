"""Tool calls in model output, in the two forms Qwen models write inside `<tool_call>` tags:

- json (Hermes; Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- xml (qwen3_coder; Qwen3-Coder, Qwen3.5, Qwen3.6): `<tool_call><function=NAME><parameter=P>value
  </parameter></function></tool_call>`, values converted by the tool's JSON schema (tool_xml.py)

`tool_call_form` picks the form from the chat template's text (the template shows the model its
form: `<function=` means xml), unless the user chose one (`--tool-call-parser json|xml`).

The interface other front-ends build on (chat/completions here; /v1/messages and /v1/responses):
`ToolCallParser(form, tools, max_calls)`, then `feed(text) -> (content, calls)` for each piece of
the stream and `flush() -> (content, calls)` at its end. Content is emitted as soon as it cannot
be the start of a `<tool_call>` tag; each call is one complete `ParsedToolCall` (name, arguments
as a JSON object string, id) when its block closes, so the output (the concatenated content and
the list of calls) is the same however the stream was cut into pieces. A block that does not
parse in the parser's form is given back as plain content (counted in `malformed`), so no model
output is ever lost. `max_calls` (1 for parallel_tool_calls=false) drops the calls after it
(counted in `dropped`). Whitespace between and around tool calls is dropped, as the template puts
it there, not the model.

Also here: the other direction, tool definitions and past tool calls rendered for chat templates.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from treeflash.errors import InvalidRequestError
from treeflash.server.tool_xml import parameter_types, parse_xml_block

START, END = "<tool_call>", "</tool_call>"
FORMS = ("json", "xml")
PARSER_CHOICES = ("auto",) + FORMS


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


def tool_call_form(template: str | None, choice: str = "auto") -> str:
    """The form a model writes its calls in: `choice` unless "auto", else read off its chat template."""
    if choice not in PARSER_CHOICES:
        raise InvalidRequestError(f"--tool-call-parser must be one of {', '.join(PARSER_CHOICES)}, got {choice!r}", "tool_call_parser")
    if choice != "auto":
        return choice
    return "xml" if template is not None and "<function=" in template else "json"


class ToolCallParser:
    def __init__(self, form: str = "json", tools: list[dict[str, Any]] | None = None, max_calls: int | None = None) -> None:
        if form not in FORMS:
            raise ValueError(f"tool-call form must be one of {FORMS}, got {form!r}")
        self.form = form
        self.types = parameter_types(tools)  # xml: {function: {parameter: schema type}}
        self.max_calls = max_calls
        self.buf = ""  # unprocessed text: a possible tag start, pending whitespace, or an open block
        self.inside = False
        self.calls: list[ParsedToolCall] = []
        self.malformed = 0  # blocks given back as content
        self.dropped = 0  # calls past max_calls

    def _block(self, body: str) -> ParsedToolCall | None:
        if self.form == "json":
            return parse_block(body)
        parsed = parse_xml_block(body, self.types)
        return None if parsed is None else ParsedToolCall(parsed[0], json.dumps(parsed[1], ensure_ascii=False))

    def _take(self, call: ParsedToolCall, calls: list[ParsedToolCall]) -> None:
        if self.max_calls is not None and len(self.calls) + len(calls) >= self.max_calls:
            self.dropped += 1
        else:
            calls.append(call)

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
                call = self._block(body)
                if call is None:
                    self.malformed += 1
                    out.append(START + body + END)
                else:
                    self._take(call, calls)
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
            call = self._block(rest)
            if call is not None:
                calls: list[ParsedToolCall] = []
                self._take(call, calls)
                self.calls.extend(calls)
                return "", calls
            self.malformed += 1
            return START + rest, []
        if self.calls and not rest.strip():
            return "", []
        return rest, []


def parse_tool_calls(text: str, form: str = "json", tools: list[dict[str, Any]] | None = None) -> tuple[str, list[ParsedToolCall]]:
    """The whole text at once (the same parser, fed once)."""
    p = ToolCallParser(form, tools)
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
