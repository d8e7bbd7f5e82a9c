"""Chunks from scripted engine events: streamed == folded, one role and one finish_reason per
choice, usage adds up, and the openai client's own stream assembly gives the folded reply."""

import asyncio
import json

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from treeflash.engine.request import TokenEvent, TokenLogprob, Usage
from treeflash.server.chunks import ReplyContext, chat_chunks, completion_chunks, fold_chat, fold_completion
from treeflash.server.tools import ToolCallParser
from treeflash.server.worker import _DONE, Job


class FakeText:
    def __call__(self, token_id):
        return f"<{token_id}>"


def scripted(deltas_per_choice, logprobs=False):
    """deltas_per_choice: [[text, ...], ...] -> the (index, TokenEvent) items a worker would send."""
    items = []
    for index, deltas in enumerate(deltas_per_choice):
        for k, text in enumerate(deltas):
            ids = [100 + k, 200 + k]  # two tokens per step, as speculation commits
            lps = [TokenLogprob(t, -0.5, [(t, -0.5), (t + 1, -1.5)]) for t in ids] if logprobs else None
            last = k == len(deltas) - 1
            ev = TokenEvent(ids, text, "stop" if last else None, lps)
            if last:
                ev.usage = Usage(7, 2 * len(deltas), 1.0, 0.1)
            items.append((index, ev))
    return items


async def collect(make_chunks, items):
    job = Job([], asyncio.get_running_loop())
    for item in items + [_DONE]:
        job.items.put_nowait(item)
    return [c async for c in make_chunks(job)]


async def refold(chunks, fold):
    async def gen():
        for c in chunks:
            yield c
    return await fold(gen())


def run_chat(deltas_per_choice, parse_tools=False, in_think=False, logprobs=False):
    ctx = ReplyContext("chatcmpl-x", 1, "m", 7, include_usage=True)
    make = lambda job: chat_chunks(job, ctx, FakeText(), in_think, ToolCallParser if parse_tools else None)  # noqa: E731
    chunks = asyncio.run(collect(make, scripted(deltas_per_choice, logprobs)))
    return chunks, asyncio.run(refold(chunks, fold_chat))


def test_chat_stream_shape_and_fold():
    chunks, reply = run_chat([["Hel", "lo", " world"], ["A", "B"]], logprobs=True)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert sum(c["finish_reason"] is not None for c in mine) == 1 and mine[-1]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 10, "total_tokens": 17,
                                                                   "prompt_tokens_details": {"cached_tokens": 0}}
    assert [c["message"]["content"] for c in reply["choices"]] == ["Hello world", "AB"]
    assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] == 10
    lp = reply["choices"][0]["logprobs"]["content"]
    assert len(lp) == 6 and lp[0]["token"] == "<100>" and lp[0]["top_logprobs"][1]["token"] == "<101>"


def test_tool_calls_streamed_assemble_like_the_fold():
    text = ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>")
    deltas = [text[i:i + 5] for i in range(0, len(text), 5)]
    chunks, reply = run_chat([deltas], parse_tools=True)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    # the official client's accumulator, fed our stream, builds the same message
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(t.id, t.function.name, t.function.arguments) for t in final.message.tool_calls] == \
        [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_tools_off_leaves_text_alone_and_reasoning_splits():
    text = "<think>plan</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>"
    _, reply = run_chat([[text[:9], text[9:]]], parse_tools=False)
    msg = reply["choices"][0]["message"]
    assert msg["reasoning_content"] == "plan" and msg["content"] == "<tool_call>{\"name\": \"f\"}</tool_call>"
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_completion_chunks_and_fold():
    ctx = ReplyContext("cmpl-x", 1, "m", 7, include_usage=True)
    make = lambda job: completion_chunks(job, ctx, FakeText())  # noqa: E731
    chunks = asyncio.run(collect(make, scripted([["ab", "cd"]], logprobs=True)))
    reply = asyncio.run(refold(chunks, fold_completion))
    choice = reply["choices"][0]
    assert choice["text"] == "abcd" and choice["finish_reason"] == "stop"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["<100>", "<200>", "<101>", "<201>"]
    assert lp["text_offset"] == [0, 5, 10, 15]  # offsets continue across chunks
    assert reply["usage"]["completion_tokens"] == 4


def test_completion_top_logprobs_always_include_the_sampled_token():
    # the sampled token (300) is outside the top 2 it came with: it is listed too, with its own logprob
    ev = TokenEvent([300], "x", "stop", [TokenLogprob(300, -4.0, [(1, -0.1), (2, -0.2)])])
    ev.usage = Usage(7, 1, 1.0, 0.1)
    ctx = ReplyContext("cmpl-x", 1, "m", 7, include_usage=True)
    chunks = asyncio.run(collect(lambda job: completion_chunks(job, ctx, FakeText()), [(0, ev)]))
    top = asyncio.run(refold(chunks, fold_completion))["choices"][0]["logprobs"]["top_logprobs"][0]
    assert top == {"<1>": -0.1, "<2>": -0.2, "<300>": -4.0}
    # logprobs=0: the sampled token alone
    ev0 = TokenEvent([5], "y", "stop", [TokenLogprob(5, -0.3, [])])
    ev0.usage = Usage(7, 1, 1.0, 0.1)
    chunks = asyncio.run(collect(lambda job: completion_chunks(job, ctx, FakeText()), [(0, ev0)]))
    assert asyncio.run(refold(chunks, fold_completion))["choices"][0]["logprobs"]["top_logprobs"] == [{"<5>": -0.3}]
