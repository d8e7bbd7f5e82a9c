"""The OpenAI Responses request body (POST /v1/responses) and its translation into chat history.

`input` is a string (one user message) or a list of items: messages (`{"role", "content"}`, with
`type: "message"` or without), `function_call`, `function_call_output` and `reasoning` items, as
a client sends back the previous turn's output. They translate to what a chat-completions client
would have sent: function calls join the assistant turn before them, each output becomes a `tool`
message, a reasoning item becomes the next assistant turn's reasoning_content. `instructions`
becomes the system message (it is not carried over by previous_response_id, as in OpenAI's API).
Fields treeflash cannot honour get a 400 naming them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from treeflash.engine.request import Grammar
from treeflash.server.errors import bad_request
from treeflash.server.structured import openai_format
from treeflash.server.tool_choice import ForcedChoice, check_choice
from treeflash.server.protocol import FunctionCall, FunctionDef, Message, StrictModel, ToolCall, ToolDef

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class Part(StrictModel):
    type: str
    text: str | None = None


class Item(StrictModel):
    type: Literal["message", "function_call", "function_call_output", "reasoning", "item_reference"] | None = None
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[Part] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call: a JSON object, as a string
    output: str | list[Part] | None = None  # function_call_output
    summary: list[Part] | None = None  # reasoning


class FunctionTool(StrictModel):
    type: str
    name: str | None = Field(None, min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ReasoningConfig(StrictModel):
    effort: str | None = None
    summary: str | None = None


class TextConfig(StrictModel):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}: grammar()
    verbosity: str | None = None


class ResponsesRequest(StrictModel):
    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    include: list[str] | None = None
    stream_options: dict[str, Any] | None = None
    conversation: Any = None
    prompt: Any = None

    def grammar(self) -> Grammar | None:
        """text.format json_schema (name, schema, strict beside type) or json_object."""
        return openai_format(self.text.format if self.text is not None else None, "text.format", flat=True)

    def check_supported(self) -> None:
        if isinstance(self.input, list) and not self.input and self.previous_response_id is None:
            raise bad_request("input is an empty list", "input")
        for i, t in enumerate(self.tools or []):
            if t.type != "function":
                raise bad_request(f"tools[{i}]: tool type {t.type!r} is not offered; only function tools", f"tools[{i}].type")
            if not t.name:
                raise bad_request(f"tools[{i}]: a function tool needs a name", f"tools[{i}].name")
        structured = self.grammar()
        check_choice(self.forced_tool_choice(), [t.name for t in self.tools or ()],
                     structured.param if structured is not None else None, "tool_choice.name")
        if self.background:
            raise bad_request("background responses are not supported", "background")
        if self.top_logprobs:
            raise bad_request("top_logprobs is not supported on /v1/responses (use /v1/chat/completions)", "top_logprobs")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise bad_request(f"{name} is not supported (send input, and previous_response_id to continue)", name)
        for name in self.include or ():
            if name != "reasoning.encrypted_content":
                raise bad_request(f"include {name!r} is not supported", "include")

    def forced_tool_choice(self) -> ForcedChoice | None:
        """tool_choice "required" (one of the tools) or {"type": "function", "name"} (that one); other
        objects (allowed_tools, hosted tools) are refused."""
        choice = self.tool_choice
        if not isinstance(choice, dict):
            return ForcedChoice() if choice == "required" else None
        if choice.get("type") != "function":
            raise bad_request(f"tool_choice of type {choice.get('type')!r} is not supported; use none, auto, required or "
                              "{'type': 'function', 'name': ...}", "tool_choice.type")
        if not isinstance(choice.get("name"), str) or not choice["name"]:
            raise bad_request("tool_choice of type 'function' needs the name of a function", "tool_choice.name")
        return ForcedChoice(choice["name"])

    @property
    def max_tool_calls_per_turn(self) -> int | None:
        return 1 if self.parallel_tool_calls is False else None

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def chat_tools(self) -> list[ToolDef] | None:
        if not self.uses_tools:
            return None
        return [ToolDef(function=FunctionDef(name=t.name, description=t.description,
                                             parameters=t.parameters or {"type": "object", "properties": {}}))
                for t in self.tools or []]

    def input_items(self) -> list[Item]:
        return [Item(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)


def chat_messages(instructions: str | None, items: list[Item]) -> list[Message]:
    """The system message from instructions, then the items as chat history."""
    out: list[Message] = [Message(role="system", content=instructions)] if instructions else []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            if item.role is None or item.content is None:
                raise bad_request(f"{where}: a message item needs role and content", where)
            text = _text(f"{where}.content", item.content)
            if item.role == "assistant":
                out.append(Message(role="assistant", content=text, reasoning_content="".join(reasoning) or None))
                reasoning = []
            else:
                out.append(Message(role=item.role, content=text))
        elif kind == "function_call":
            if not item.call_id or not item.name or item.arguments is None:
                raise bad_request(f"{where}: a function_call item needs call_id, name and arguments", where)
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(Message(role="assistant", content="", tool_calls=[call], reasoning_content="".join(reasoning) or None))
                reasoning = []
        elif kind == "function_call_output":
            if not item.call_id or item.output is None:
                raise bad_request(f"{where}: a function_call_output item needs call_id and output", where)
            out.append(Message(role="tool", content=_text(f"{where}.output", item.output), tool_call_id=item.call_id))
        elif kind == "reasoning":
            parts = (item.content if isinstance(item.content, list) else None) or item.summary or []
            reasoning.append(_text(f"{where}.content", parts))
        elif kind == "item_reference":
            raise bad_request(f"{where}: item_reference is not supported (send the item itself, or previous_response_id)", where)
        else:
            raise bad_request(f"{where}: an item needs a type (message, function_call, function_call_output, reasoning) "
                              "or a role", where)
    if not out or all(m.role == "system" for m in out):
        raise bad_request("input has no message to answer", "input")
    return out


def _text(where: str, content: str | list[Part]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for k, p in enumerate(content):
        if p.type not in TEXT_PARTS or p.text is None:
            raise bad_request(f"{where}[{k}]: only text parts are supported, got type {p.type!r}", f"{where}[{k}]")
        texts.append(p.text)
    return "\n".join(texts)
