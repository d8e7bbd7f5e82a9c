"""`treeflash generate` on a Qwen3.5 MTP GGUF (random weights, llama.cpp's nextn layout): --draft mtp
(chain and --mtp-tree) prints exactly what plain decoding prints at temperature 0, and --no-think /
--chat-template-kwargs reach the template (one that toggles on enable_thinking as Qwen3.5's does,
written in the test vocabulary's characters: no spaces or newlines)."""

import pytest
from gguf import GGMLQuantizationType as Q

import treeflash.engine.chat as chat
from tests.models.test_loaders import random_hf
from tests.models.test_mtp_gguf import random_mtp, write_mtp_gguf
from treeflash.cli.main import main

THINKING_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
                     "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% else %}<think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def mtp_gguf(tmp_path_factory):
    hf = random_hf("qwen3_5")
    path = tmp_path_factory.mktemp("gen") / "q35-mtp.gguf"
    return write_mtp_gguf(path, hf, random_mtp(hf, Q.Q8_0), template=THINKING_TEMPLATE)


def generate(capsys, monkeypatch, model, *flags):
    prompts = []
    real = chat.render_chat
    monkeypatch.setattr(chat, "render_chat", lambda *a, **k: prompts.append(real(*a, **k)) or prompts[-1])
    rc = main(["generate", "--model", str(model), "--chat", "hi", "--max-tokens", "24", "--ignore-eos", "--quiet",
               "--device", "cpu", "--threads", "1", *flags])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out, out.err, prompts[-1]


def test_draft_mtp_prints_what_plain_decoding_prints(capsys, monkeypatch, mtp_gguf):
    plain, _, _ = generate(capsys, monkeypatch, mtp_gguf)
    chain, err, _ = generate(capsys, monkeypatch, mtp_gguf, "--draft", "mtp", "--num-draft", "3")
    tree, err_tree, _ = generate(capsys, monkeypatch, mtp_gguf, "--draft", "mtp", "--num-draft", "3", "--mtp-tree", "--budget", "8")
    assert chain == plain and tree == plain
    assert "draft=mtp" in err and "draft=mtp" in err_tree


def test_no_think_and_template_kwargs(capsys, monkeypatch, mtp_gguf):
    assert generate(capsys, monkeypatch, mtp_gguf)[2] == "hi<think>"
    assert generate(capsys, monkeypatch, mtp_gguf, "--no-think")[2] == "hi<think></think>"
    assert generate(capsys, monkeypatch, mtp_gguf, "--chat-template-kwargs", '{"enable_thinking": false}')[2] == "hi<think></think>"
    assert generate(capsys, monkeypatch, mtp_gguf, "--chat-template-kwargs", '{"enable_thinking": true}')[2] == "hi<think>"


def test_bad_template_kwargs_name_the_flag(capsys, mtp_gguf):
    assert main(["generate", "--model", str(mtp_gguf), "--chat", "hi", "--chat-template-kwargs", "{oops"]) == 2
    assert "--chat-template-kwargs is not valid JSON" in capsys.readouterr().err
