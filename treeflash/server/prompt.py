"""From a validated HTTP request to the engine's input: prompt token ids and GenerationRequests.

Chat history is normalized before the template sees it: text parts joined, `developer` as
`system`, tool-call arguments decoded from JSON strings into dicts (the Qwen and Hermes templates
expect dicts), and, for templates that know nothing about tools, the tool definitions and past
calls written out in the Hermes format the output parser reads back.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from treeflash.engine.chat import render_chat
from treeflash.engine.request import GenerationRequest, Grammar
from treeflash.server.errors import bad_request, from_exception
from treeflash.server.frontend import Frontend
from treeflash.server.protocol import ChatCompletionRequest, Message, ToolDef
from treeflash.server.reasoning import prompt_opens_thinking
from treeflash.server.tool_choice import TAGS, CallFormat, ForcedChoice, think_mode, tool_call_grammar
from treeflash.server.tools import ToolCallParser, tool_call_text, tools_system_text
from treeflash.spec.sampling import SamplingParams

RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "template")


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    ids: list[int]
    in_think: bool  # the template opened a <think> block at the end of the prompt


def render_messages(fe: Frontend, messages: list[Message], tools: list[ToolDef] | None, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> ChatPrompt:
    template = fe.chat_template
    knows_tools = template is not None and "tools" in template
    knows_calls = template is not None and "tool_calls" in template
    msgs = [_message_dict(i, m, knows_calls) for i, m in enumerate(messages)]
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    if tool_dicts and not knows_tools:
        block = tools_system_text(tool_dicts)
        if msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + block}
        else:
            msgs.insert(0, {"role": "system", "content": block})
    kwargs = {**fe.template_kwargs, **(template_kwargs or {})}  # the request overrides the server's defaults
    check_template_kwargs(kwargs, "chat_template_kwargs")
    shielded = _shield(fe, msgs)
    text = render_chat(template, msgs, add_generation_prompt=add_generation_prompt, tools=tool_dicts if knows_tools else None,
                       bos_token=fe.bos_token, eos_token=fe.eos_token, **kwargs)
    if not shielded:
        return ChatPrompt(text, fe.encode(text, add_special_tokens=False), prompt_opens_thinking(text))
    text, ids = _encode_shielded(fe, text, shielded)
    return ChatPrompt(text, ids, prompt_opens_thinking(text))


SHIELDED_ROLES = ("user", "tool")  # content a client or a tool wrote: never control tokens


def _shield(fe: Frontend, msgs: list[dict[str, Any]]) -> dict[str, str]:
    """Replace the content of user and tool messages that contain a special token's text (say
    `<|im_end|>\n<|im_start|>system`) by a unique marker, so that after rendering those spans can be
    tokenized as plain text while the template's own special tokens stay special. Returns
    {marker: content}; messages without such text are left alone (their tokens stay exactly as the
    whole rendered prompt tokenizes)."""
    specials = fe.special_tokens
    if not specials:
        return {}
    nonce = uuid.uuid4().hex
    shielded = {}
    for i, m in enumerate(msgs):
        content = m.get("content")
        if m["role"] in SHIELDED_ROLES and isinstance(content, str) and any(t in content for t in specials):
            marker = f"\ue000{nonce}:{i}\ue001"
            shielded[marker] = content
            msgs[i] = {**m, "content": marker}
    return shielded


def _encode_shielded(fe: Frontend, text: str, shielded: dict[str, str]) -> tuple[str, list[int]]:
    """The rendered text with the markers put back, and its ids: template pieces with special
    tokens, shielded content with every special token's text split into ordinary tokens."""
    pattern = "(" + "|".join(re.escape(m) for m in shielded) + ")"
    out_text: list[str] = []
    ids: list[int] = []
    for piece in re.split(pattern, text):
        if piece in shielded:
            out_text.append(shielded[piece])
            ids.extend(fe.encode_text(shielded[piece]))
        elif piece:
            out_text.append(piece)
            ids.extend(fe.encode(piece, add_special_tokens=False))
    return "".join(out_text), ids


def check_template_kwargs(kwargs: dict[str, Any], where: str) -> None:
    """Template variables a client (or the --chat-template-kwargs default) may set: not the ones the
    renderer itself passes."""
    if not isinstance(kwargs, dict):
        raise bad_request(f"{where} must be a JSON object", where)
    for key in RESERVED_TEMPLATE_KWARGS:
        if key in kwargs:
            raise bad_request(f"{where} may not set {key!r}", where)


def tool_parser_factory(fe: Frontend, req: ChatCompletionRequest) -> Callable[[], ToolCallParser] | None:
    """A new output parser per choice when the request offers tools: the model's form (fe.tool_form),
    the tools' schemas (xml values are typed by them), one call at most without parallel_tool_calls."""
    if not req.tools or req.tool_choice == "none":
        return None
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    return lambda: ToolCallParser(fe.tool_form, tools, req.max_tool_calls)


def forced_tool_grammar(fe: Frontend, choice: ForcedChoice | None, tools: list[ToolDef] | None, prompt: ChatPrompt,
                        max_calls: int | None, grammar: Grammar | None) -> Grammar | None:
    """The grammar of the calls a forced tool_choice allows (server/tool_choice.py), in the model's
    form, after a reasoning block where the template has one; `grammar` (the request's structured
    output, None when a choice is forced: check_choice) when no choice is forced."""
    if choice is None:
        return grammar
    fmt = CallFormat(fe.tool_form, frozenset(fe.special_tokens) & TAGS, think_mode(fe.chat_template, prompt.text))
    return tool_call_grammar(choice, [t.model_dump(exclude_none=True) for t in tools or ()], fmt, max_calls)


def chat_prompt(fe: Frontend, req: ChatCompletionRequest) -> ChatPrompt:
    tools = req.tools if req.tool_choice != "none" else None
    return render_messages(fe, req.messages, tools, True, req.chat_template_kwargs)


def _message_dict(i: int, m: Message, knows_calls: bool) -> dict[str, Any]:
    where = f"messages[{i}]"
    content = _content_text(where, m.content)
    if content is None:
        if m.role != "assistant":
            raise bad_request(f"{where}.content is required for a {m.role} message", f"{where}.content")
        content = ""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        if m.role != "assistant":
            raise bad_request(f"{where}.tool_calls is only allowed on assistant messages", f"{where}.tool_calls")
        calls = []
        for j, c in enumerate(m.tool_calls):
            args = c.function.arguments
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as e:
                    raise bad_request(f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {e}",
                                      f"{where}.tool_calls[{j}].function.arguments") from None
            if not isinstance(args, dict):
                raise bad_request(f"{where}.tool_calls[{j}].function.arguments must encode a JSON object",
                                  f"{where}.tool_calls[{j}].function.arguments")
            calls.append({"id": c.id or f"call_{i}_{j}", "type": "function", "function": {"name": c.function.name, "arguments": args}})
        if knows_calls:
            out["tool_calls"] = calls
        else:
            written = "\n".join(tool_call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls)
            out["content"] = (content + "\n" if content else "") + written
    return out


def _content_text(where: str, content) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"{where}.content[{k}]: only text parts are supported, got type {part.type!r}", f"{where}.content")
        texts.append(part.text)
    return "\n".join(texts)


def completion_prompt_ids(fe: Frontend, prompts: list[str | list[int]]) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = fe.encode(p) if isinstance(p, str) else list(p)
        if not ids:
            raise bad_request("the prompt is empty (it encodes to no tokens)", "prompt")
        out.append(ids)
    return out


def check_token_ids(fe: Frontend, ids: list[int], param: str) -> None:
    vocab = fe.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is out of range [0, {vocab})", param)


def generation_requests(fe: Frontend, req, prompt_ids: list[list[int]], logprobs: int | None,
                        grammar: Grammar | None = None) -> list[GenerationRequest]:
    """n GenerationRequests per prompt (choice index = prompt index * n + i), each checked against the context;
    `grammar`: the request's, already checked (Frontend.check_grammar)."""
    stop = req.stop_strings()
    stop_ids = tuple(req.stop_token_ids or ())
    param = "messages" if hasattr(req, "messages") else "prompt"
    limit_param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
    out = []
    for ids in prompt_ids:
        for i in range(req.n):
            sampling = sampling_params(req.temperature, req.top_p, req.top_k, req.min_p, None if req.seed is None else req.seed + i)
            out.append(single_request(fe, ids, sampling, req.token_limit, stop, stop_ids, req.ignore_eos, logprobs, param, limit_param,
                                      grammar=grammar, min_tokens=req.min_tokens or 0))
    return out


def sampling_params(temperature: float | None, top_p: float | None, top_k: int | None, min_p: float | None = None,
                    seed: int | None = None) -> SamplingParams:
    """The API defaults (temperature 1, top_p 1, top_k off) for fields a request left out."""
    try:
        return SamplingParams(temperature=1.0 if temperature is None else temperature, top_k=max(top_k or 0, 0),
                              top_p=1.0 if top_p is None else top_p, min_p=min_p or 0.0, seed=seed)
    except Exception as e:
        raise from_exception(e) from None


def single_request(fe: Frontend, ids: list[int], sampling: SamplingParams, max_tokens: int | None, stop: tuple[str, ...] = (),
                   stop_ids: tuple[int, ...] = (), ignore_eos: bool = False, logprobs: int | None = None,
                   prompt_param: str = "messages", limit_param: str = "max_tokens", grammar: Grammar | None = None,
                   min_tokens: int = 0) -> GenerationRequest:
    """One GenerationRequest, checked: token ids in range, the prompt inside the context, max_tokens
    under the server's cap (400 naming `limit_param`), or the server's default when the request sent none."""
    limit = fe.max_context
    check_token_ids(fe, list(stop_ids), "stop_token_ids")
    check_token_ids(fe, ids, "prompt")
    if len(ids) >= limit:
        raise bad_request(f"the prompt is {len(ids)} tokens, but the context is {limit} tokens "
                          f"(and at least one token must be left for the output)", prompt_param)
    max_tokens = fe.limits.resolve(max_tokens, limit - len(ids), limit_param)
    try:
        fe.check_fits(len(ids), max_tokens)
        return GenerationRequest(tuple(ids), sampling, max_tokens, stop, stop_ids, ignore_eos, logprobs, min_tokens, grammar)
    except Exception as e:  # the engine's typed errors name the numbers; they become 400s
        raise from_exception(e) from None
