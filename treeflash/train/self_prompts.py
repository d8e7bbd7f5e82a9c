"""Prompts written by the target itself (`train-drafter --self-prompts N`).

The one H200 training run so far was short of distinct data, not of steps (docs/train.md: train
loss 1.27 against held-out 5.04 after ~27 epochs over ~3,000 answers). The builtin prompt list is
a few thousand prompts; sampled extra passes give new answers to the same prompts. This gives new
prompts: the target, sampled, writes the *user's* turn of a chat, started with a short opener
("Write", "Explain", "def", ...), and stops where its user turn ends (an end-of-turn / EOS token).
Those questions are then answered like any other prompt. Everything stays the target's own
distribution, and no dataset is downloaded.

Kept: finished turns (the target closed its user turn) of at least MIN_CHARS characters, not
seen before, and not one of the held-out evaluation prompts.
"""

from __future__ import annotations

import random
import time

from treeflash.data.prompts import BenchPrompt
from treeflash.errors import InvalidRequestError
from treeflash.train.prompts import HELDOUT_CHAT

SENTINEL = "\u2063treeflash-user-turn\u2063"
MIN_CHARS = 12
# how the target's user turns start: a mix of chat, explanation and code requests
OPENERS = (
    "Write", "Explain", "How do I", "How does", "What is", "What are", "Why does", "Can you", "Give me",
    "Implement", "Create a Python function", "Write a function", "Fix this code", "Compare", "List",
    "Summarize", "Describe", "Help me", "Tell me about", "I need", "Translate", "Suggest", "def",
    "Write a short story", "Write a poem", "Plan", "What's the difference between", "Show me",
)


def user_turn_prefix(loaded) -> str:
    """The chat-template text that comes before a (first) user message's content."""
    from treeflash.engine.chat import render_chat

    text = render_chat(loaded.chat_template, [{"role": "user", "content": SENTINEL}], add_generation_prompt=False)
    cut = text.find(SENTINEL)
    if cut < 0:
        raise InvalidRequestError("--self-prompts needs a chat template that shows the user's message", "self_prompts")
    return text[:cut]


def self_prompts(
    twin,  # features.TargetTwin (or anything with its generate())
    loaded,  # LoadedModel: tokenizer and chat template
    count: int,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    batch_size: int = 256,
    time_limit_s: float | None = None,
    progress: bool = True,
) -> tuple[list[BenchPrompt], dict]:
    """Up to `count` user prompts written by the target; returns them and a summary for the data's meta."""
    from tqdm.auto import tqdm

    tok = loaded.tokenizer
    prefix = user_turn_prefix(loaded)
    rng = random.Random(seed)
    seen = set(HELDOUT_CHAT)
    out: list[BenchPrompt] = []
    tried = unfinished = short = repeated = 0
    t0 = time.perf_counter()
    bar = tqdm(total=count, desc="self-prompts", unit="prompt", disable=not progress)
    rounds = 0
    while len(out) < count and rounds < 4 * (count // max(batch_size, 1) + 1):
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            break
        openers = [rng.choice(OPENERS) for _ in range(min(batch_size, 2 * (count - len(out)) + 8))]
        ids = [list(tok(prefix + o, add_special_tokens=False)["input_ids"]) for o in openers]
        gens = twin.generate(ids, max_new_tokens, temperature, seed + 7919 * rounds)
        rounds += 1
        for opener, g in zip(openers, gens):
            tried += 1
            if not g.finished:
                unfinished += 1
                continue
            text = (opener + tok.decode(g.response_ids, skip_special_tokens=True)).strip()
            if len(text) < MIN_CHARS:
                short += 1
                continue
            if text in seen:
                repeated += 1
                continue
            seen.add(text)
            out.append(BenchPrompt(f"self/{len(out)}", messages=({"role": "user", "content": text},)))
            bar.update(1)
            if len(out) >= count:
                break
    bar.close()
    meta = {"requested": count, "written": len(out), "tried": tried, "unfinished": unfinished, "too_short": short,
            "repeated": repeated, "temperature": temperature, "seconds": round(time.perf_counter() - t0, 1)}
    return out, meta
