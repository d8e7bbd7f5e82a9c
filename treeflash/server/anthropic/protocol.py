"""The Anthropic Messages request body (POST /v1/messages, /v1/messages/count_tokens), and its
translation into the chat history the template renders.

Parsing is as strict as the OpenAI routes (treeflash.server.protocol.parse: every failure one 400
naming the field). Content blocks translate so that the template sees what a chat-completions
client would have sent: `tool_use` blocks become the assistant's tool_calls, each `tool_result`
a `tool` message (ahead of the user's text in the same turn, the order the model asked for them),
`thinking` blocks the assistant's reasoning_content. Blocks treeflash cannot read (images,
documents, server tools) get a 400 naming them; `redacted_thinking` is dropped (it is encrypted
for another model, nothing here can read it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from treeflash.engine.request import Grammar
from treeflash.server.errors import bad_request
from treeflash.server.structured import anthropic_format
from treeflash.server.tool_choice import ForcedChoice, check_choice
from treeflash.server.protocol import MAX_STOP, FunctionCall, FunctionDef, Message, StrictModel, ToolCall, ToolDef


class Block(StrictModel):
    """Any content block; which fields a type needs is checked by the translation, for clear messages."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list["Block"] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    thinking: str | None = None  # thinking
    signature: str | None = None  # thinking


class MessageParam(StrictModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(StrictModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; Anthropic's server tools (web_search_..., bash_...) are not offered


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(StrictModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class MessagesBody(StrictModel):
    """What /v1/messages and /v1/messages/count_tokens share."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    output_config: dict[str, Any] | None = None  # {"effort": ...} is a hint and ignored; {"format": ...} constrains (grammar())

    def check_supported(self) -> None:
        for i, t in enumerate(self.tools or []):
            if t.type not in (None, "custom"):
                raise bad_request(f"tools[{i}]: the server tool type {t.type!r} is not offered; only custom tools "
                                  "(name, description, input_schema)", f"tools[{i}].type")
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise bad_request("tool_choice.name is required for a tool_choice of type 'tool'", "tool_choice.name")
        structured = self.grammar()
        check_choice(self.forced_tool_choice(), [t.name for t in self.tools or ()],
                     structured.param if structured is not None else None, "tool_choice.name")
        if self.mcp_servers:
            raise bad_request("mcp_servers is not supported", "mcp_servers")
        if self.container is not None:
            raise bad_request("container is not supported", "container")
        for key in self.output_config or {}:
            if key not in ("effort", "format"):
                raise bad_request(f"output_config.{key} is not supported", f"output_config.{key}")

    def grammar(self) -> Grammar | None:
        """output_config.format {"type": "json_schema", "schema"}: the output matches the schema."""
        return anthropic_format((self.output_config or {}).get("format"))

    def forced_tool_choice(self) -> ForcedChoice | None:
        """tool_choice {"type": "any"} (one of the tools) or {"type": "tool", "name"} (that one)."""
        kind = self.tool_choice.type if self.tool_choice is not None else None
        if kind == "tool":
            return ForcedChoice(self.tool_choice.name)
        return ForcedChoice() if kind == "any" else None

    @property
    def max_tool_calls(self) -> int | None:
        """disable_parallel_tool_use: at most one call (exactly one with "any" or "tool")."""
        return 1 if self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use else None

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and not (self.tool_choice is not None and self.tool_choice.type == "none")

    def chat_tools(self) -> list[ToolDef] | None:
        if not self.uses_tools:
            return None
        return [ToolDef(function=FunctionDef(name=t.name, description=t.description,
                                             parameters=t.input_schema or {"type": "object", "properties": {}}))
                for t in self.tools or []]

    def template_kwargs(self) -> dict[str, Any] | None:
        """`thinking` switches the template's enable_thinking (Qwen3-style templates); absent: the template's default."""
        if self.thinking is None:
            return None
        return {"enable_thinking": self.thinking.type != "disabled"}

    def chat_messages(self) -> list[Message]:
        out: list[Message] = []
        system = _system_text(self.system)
        if system:
            out.append(Message(role="system", content=system))
        for i, m in enumerate(self.messages):
            out.extend(_translate(i, m))
        return out


class MessagesRequest(MessagesBody):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool | None = False
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if any(not s for s in self.stop_sequences or ()):
            raise bad_request("stop_sequences must be non-empty strings", "stop_sequences")


class CountTokensRequest(MessagesBody):
    pass


def _system_text(system: str | list[Block] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for k, b in enumerate(system):
        if b.type != "text" or b.text is None:
            raise bad_request(f"system[{k}]: only text blocks are allowed in system, got type {b.type!r}", f"system[{k}]")
        texts.append(b.text)
    return "\n\n".join(texts)


def _translate(i: int, m: MessageParam) -> list[Message]:
    where = f"messages[{i}]"
    if isinstance(m.content, str):
        return [Message(role=m.role, content=m.content)]
    texts, thinking, calls, results = [], [], [], []
    for k, b in enumerate(m.content):
        at = f"{where}.content[{k}]"
        if b.type == "text":
            if b.text is None:
                raise bad_request(f"{at}: a text block needs text", f"{at}.text")
            texts.append(b.text)
        elif b.type == "tool_use" and m.role == "assistant":
            if not b.id or not b.name:
                raise bad_request(f"{at}: a tool_use block needs id and name", at)
            calls.append(ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=b.input or {})))
        elif b.type == "tool_result" and m.role == "user":
            if not b.tool_use_id:
                raise bad_request(f"{at}: a tool_result block needs tool_use_id", f"{at}.tool_use_id")
            results.append(Message(role="tool", content=_result_text(at, b), tool_call_id=b.tool_use_id))
        elif b.type == "thinking" and m.role == "assistant":
            thinking.append(b.thinking or "")
        elif b.type == "redacted_thinking" and m.role == "assistant":
            continue
        else:
            raise bad_request(f"{at}: content blocks of type {b.type!r} are not supported in a {m.role} message "
                              "(text, tool_use, tool_result and thinking are)", at)
    if m.role == "user":
        rest = [Message(role="user", content="\n".join(texts))] if texts or not results else []
        return results + rest
    return [Message(role="assistant", content="\n".join(texts), tool_calls=calls or None,
                    reasoning_content="".join(thinking) if thinking else None)]


def _result_text(at: str, b: Block) -> str:
    if b.content is None or isinstance(b.content, str):
        text = b.content or ""
    else:
        parts = []
        for j, c in enumerate(b.content):
            if c.type != "text" or c.text is None:
                raise bad_request(f"{at}.content[{j}]: only text is supported inside a tool_result, got type {c.type!r}",
                                  f"{at}.content[{j}]")
            parts.append(c.text)
        text = "\n".join(parts)
    return f"Error: {text}" if b.is_error else text
