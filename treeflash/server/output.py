"""One choice's output text -> ordered parts: reasoning, content text, and complete tool calls.

The wire formats differ (chat deltas, Anthropic content blocks, Responses output items), but what
the model wrote is split the same way for all of them: `ReasoningSplitter` takes `<think>` text
out first, then `ToolCallParser` takes tool-call blocks out of the rest. `OutputSplitter` is that
pipeline for one choice; `job_parts` runs it over a one-choice job and ends with a `Finish`, the
primitive the Anthropic and Responses routes are folds and streams over.

Within one engine event the parts come out as reasoning, then content, then tool calls (a
speculative step may commit text on both sides of a tag; the parsers give content and calls
separately, so that is the finest order they know).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from treeflash.engine.request import Usage
from treeflash.server.reasoning import ReasoningSplitter
from treeflash.server.tools import ParsedToolCall, ToolCallParser
from treeflash.server.worker import Job


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Call:
    call: ParsedToolCall


@dataclass(frozen=True)
class Finish:
    reason: str  # the engine's: "stop" | "length" | "cancelled"
    usage: Usage | None
    stop_string: str | None  # the stop string that ended the output, when one did
    num_calls: int  # tool calls parsed from the whole output


Part = Reasoning | Text | Call


ToolParserFactory = Callable[[], ToolCallParser]  # a new parser per choice (its form, tool schemas, call limit)


def tool_parser_for(form: str, tools: list[Any] | None, max_calls: int | None = None) -> ToolParserFactory | None:
    """The factory for a request that offers `tools` (pydantic tool definitions or dicts), in the
    model's tool-call form (Frontend.tool_form); None when it offers none."""
    if not tools:
        return None
    schemas = [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t for t in tools]
    return lambda: ToolCallParser(form, schemas, max_calls)


class OutputSplitter:
    def __init__(self, in_think: bool, tool_parser: ToolParserFactory | None):
        self.reasoning = ReasoningSplitter(in_think)
        self.tools = tool_parser() if tool_parser is not None else None
        self.num_calls = 0

    def feed(self, text: str, final: bool) -> tuple[str, str, list[ParsedToolCall]]:
        """(reasoning, content, tool calls) safe to emit after this text; `final` flushes every buffer."""
        reasoning, content = self.reasoning.feed(text)
        if final:
            r, c = self.reasoning.flush()
            reasoning, content = reasoning + r, content + c
        calls: list[ParsedToolCall] = []
        if self.tools is not None:
            content, calls = self.tools.feed(content)
            if final:
                c, late = self.tools.flush()
                content, calls = content + c, calls + late
        self.num_calls += len(calls)
        return reasoning, content, calls

    def parts(self, text: str, final: bool) -> list[Part]:
        reasoning, content, calls = self.feed(text, final)
        out: list[Part] = [Reasoning(reasoning)] if reasoning else []
        if content:
            out.append(Text(content))
        out.extend(Call(c) for c in calls)
        return out


async def job_parts(job: Job, in_think: bool, tool_parser: ToolParserFactory | None) -> AsyncIterator[Part | Finish]:
    """The parts of a one-choice job, then exactly one Finish (an APIError from the job propagates)."""
    splitter = OutputSplitter(in_think, tool_parser)
    async for _, ev in job.events():
        final = ev.finish_reason is not None
        for part in splitter.parts(ev.text, final):
            yield part
        if final:
            yield Finish(ev.finish_reason, ev.usage, ev.stop_string, splitter.num_calls)
            return
