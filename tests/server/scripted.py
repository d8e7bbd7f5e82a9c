"""Scripted model output for live-server tests: what a model would write when it calls a tool or
thinks, which no small real model can be made to write on cue.

The text comes from the prompt (a trigger in the last message), and goes out the way an engine
sends it: a few characters per event (one character per token, so one event is a multi-token
delta, as speculation commits), tags split across events, then a final event with usage.

Also `AsciiTokenizer` (one token per printable ASCII character: the prompt the engine sees reads
back exactly), a Qwen-style chat template, and `StubEngine`, a pure-Python engine for in-process
app tests that need no model at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from treeflash.engine.request import GenerationRequest, TokenEvent, Usage
from treeflash.server.tools import parse_tool_calls

TOOL_TRIGGER = "SCRIPT:tool"  # the model calls get_weather (Paris) and get_time, after a sentence
THINK_TRIGGER = "SCRIPT:think"  # the model thinks, then answers
PIECE = 5  # characters (= tokens) per event

TOOL_OUTPUT = (
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>"
)
THOUGHT = "The user wants a greeting.\n"
ANSWER = "Hello!"
TOOL_REPLY_PREFIX = "Results: "  # + "name: result" for each call of the previous turn, read back from the prompt

# Qwen style: renders tools and past tool calls itself, and opens <think> when enable_thinking is on.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


class AsciiTokenizer:
    """Token i < 95 is chr(32 + i), 95 is a newline, 96 the end of sequence; anything else encodes as '?'."""

    eos_token_id = 96
    bos_token = ""
    eos_token = "<eos>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [95 if c == "\n" else ord(c) - 32 if 32 <= ord(c) < 127 else ord("?") - 32 for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join("\n" if i == 95 else "" if i == 96 else chr(32 + i % 97) if i < 95 else "?" for i in ids)


def messages_of(prompt: str) -> list[tuple[str, str]]:
    """[(role, content)] of a ChatML prompt, without the open assistant turn at its end; [("", prompt)]
    for a plain completion prompt."""
    if "<|im_start|>" not in prompt:
        return [("", prompt)]
    out = []
    for turn in prompt.split("<|im_start|>")[1:]:
        role, _, content = turn.partition("\n")
        if "<|im_end|>" in content:
            out.append((role, content.split("<|im_end|>")[0]))
    return out


def script_for(prompt: str) -> str | None:
    """The output a scripted model writes for this prompt, or None to let the real model decode.

    After tool results, it reports each call it made in its previous turn (read back from the
    rendered prompt) with the result given for it: proof that both reached the model."""
    msgs = messages_of(prompt)
    role, content = msgs[-1] if msgs else ("", "")
    if role == "tool":
        results = []
        while msgs and msgs[-1][0] == "tool":
            results.insert(0, msgs.pop()[1])
        _, calls = parse_tool_calls(msgs[-1][1] if msgs and msgs[-1][0] == "assistant" else "")
        names = [c.name for c in calls] + ["?"] * (len(results) - len(calls))
        return TOOL_REPLY_PREFIX + "; ".join(f"{n}: {r}" for n, r in zip(names, results))
    if TOOL_TRIGGER in content:
        return TOOL_OUTPUT
    if THINK_TRIGGER in content:
        opened = prompt.rstrip().endswith("<think>")  # the template opened the block: the model writes the rest
        return (THOUGHT if opened else "<think>\n" + THOUGHT) + "</think>\n\n" + ANSWER
    return None


def scripted_events(text: str, encode, req: GenerationRequest, cancelled: threading.Event | None,
                    step_delay: float = 0.0) -> Iterator[TokenEvent]:
    """`text` as an engine would stream it: PIECE tokens per event, cut at max_tokens ("length")."""
    t0 = time.perf_counter()
    ids = encode(text)
    assert len(ids) == len(text), "scripts are ASCII: one token per character"
    produced = 0
    while True:
        piece, finish = ids[produced:produced + PIECE], None
        if produced + len(piece) >= req.max_tokens:
            piece, finish = piece[: req.max_tokens - produced], "length"
        chars = text[produced:produced + len(piece)]
        produced += len(piece)
        if finish is None and produced >= len(ids):
            finish = "stop"
        if finish is None and cancelled is not None and cancelled.is_set():
            finish = "cancelled"
        event = TokenEvent(list(piece), chars, finish)
        if finish is not None:
            event.usage = Usage(len(req.prompt_ids), produced, time.perf_counter() - t0, 0.0)
            yield event
            return
        yield event
        time.sleep(step_delay)


@dataclass
class _Config:
    vocab_size: int = 97


@dataclass
class _Model:
    config: _Config


@dataclass
class _Loaded:
    chat_template: str


class StubEngine:
    """What the server uses of an Engine, in pure Python: scripted replies, and for any other prompt
    `default_text`. Each event waits `step_delay` seconds."""

    def __init__(self, step_delay: float = 0.0, max_context: int = 256, default_text: str = "plain words from a stub"):
        self.tokenizer = AsciiTokenizer()
        self.loaded = _Loaded(TEMPLATE)
        self.model = _Model(_Config())
        self.max_context = max_context
        self.step_delay = step_delay
        self.default_text = default_text
        from treeflash.spec.stats import SpecStats

        self.totals = SpecStats()  # what /metrics reads: no speculation here
        from treeflash.engine.grammar import GrammarCompiler

        self.grammars = GrammarCompiler(self.tokenizer, 97, [96])  # grammars are checked against the ASCII vocabulary

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        from treeflash.errors import ContextOverflowError

        if prompt_len + max_tokens > self.max_context:
            raise ContextOverflowError(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the context length "
                                       f"{self.max_context}", "max_tokens")

    def stream(self, req: GenerationRequest, cancelled: threading.Event | None = None) -> Iterator[TokenEvent]:
        prompt = self.tokenizer.decode(list(req.prompt_ids))
        text = script_for(prompt) or self.default_text
        yield from scripted_events(text, lambda t: self.tokenizer(t)["input_ids"], req, cancelled, self.step_delay)


def tool_calls_of(message) -> list[tuple[str, dict]]:
    """[(name, arguments as an object)] of an openai ChatCompletionMessage."""
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
