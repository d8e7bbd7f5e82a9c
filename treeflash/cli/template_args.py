"""--chat-template-kwargs and --no-think: chat template variables for generate and serve.

Thinking models toggle their <think> block with a template variable (Qwen3 / Qwen3.5 / Qwen3.6:
enable_thinking), so a switch for it is a template kwarg, not an engine setting. On serve these
are defaults: a request's own chat_template_kwargs override them key by key.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from treeflash.errors import InvalidRequestError


def add_template_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chat template")
    g.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='variables for the chat template, as a JSON object, e.g. \'{"enable_thinking": false}\'')
    g.add_argument("--no-think", action="store_true", help='thinking models answer without a <think> block: sets enable_thinking to false')


def template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags -> template variables (InvalidRequestError naming the flag on bad JSON)."""
    out: dict[str, Any] = {}
    if args.chat_template_kwargs:
        try:
            out = json.loads(args.chat_template_kwargs)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"--chat-template-kwargs is not valid JSON: {e}", "chat_template_kwargs") from None
        if not isinstance(out, dict):
            raise InvalidRequestError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'",
                                      "chat_template_kwargs")
    if args.no_think:
        out["enable_thinking"] = False
    return out
