"""Chat templates, rendered in a sandboxed Jinja environment (a template from a checkpoint is
data, never code: no attribute access to Python internals, no imports, no file access).

The environment is the one transformers' apply_chat_template renders with
(transformers/utils/chat_template_utils.py), so prompts are byte-for-byte what the model was
trained on: trim_blocks and lstrip_blocks, the loop controls {% break %} / {% continue %}, a
`tojson` that does not HTML-escape and takes ensure_ascii / indent / separators / sort_keys, the
globals raise_exception and strftime_now, and {% generation %} blocks (transformers marks the
assistant's tokens with them; here they render their body). tests/engine/test_chat_templates.py
checks the real Qwen2.5, Qwen3, Qwen3.5/3.6 and Qwen3-Coder templates against transformers."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from treeflash.errors import InvalidRequestError

# Used when a checkpoint ships no template (ChatML, which SmolLM2 and Qwen use).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VALID_ROLES = ("system", "user", "assistant", "tool", "developer")


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False) -> str:
    """transformers' tojson: plain json.dumps (Jinja's own escapes <, >, & and ' for HTML)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """{% generation %} ... {% endgeneration %}: the body, unchanged (transformers tracks its span)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = _env()
_COMPILED: dict[str, Any] = {}


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    documents: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    """messages: [{"role": ..., "content": str | None, "tool_calls"?: [...], ...}] -> prompt text.
    kwargs (chat_template_kwargs, e.g. enable_thinking) become template variables, as in transformers."""
    if not messages:
        raise InvalidRequestError("messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if m.get("role") not in VALID_ROLES:
            raise InvalidRequestError(f"messages[{i}].role must be one of {', '.join(VALID_ROLES)}, got {m.get('role')!r}", "messages")
    template = template or CHATML
    compiled = _COMPILED.get(template)
    if compiled is None:
        try:
            compiled = _COMPILED[template] = _ENV.from_string(template)
        except TemplateError as e:
            raise InvalidRequestError(f"the model's chat template does not compile: {e}") from None
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            bos_token=bos_token,
            eos_token=eos_token,
            **kwargs,
        )
    except TemplateError as e:
        raise InvalidRequestError(f"chat template error: {e}", "messages") from None
    except Exception as e:  # a template that fails on this input is the request's problem, not the server's
        raise InvalidRequestError(f"chat template failed on these messages: {type(e).__name__}: {e}", "messages") from None
