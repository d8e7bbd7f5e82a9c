"""`treeflash generate --draft ngram|draft|mtp`: the one-line summary on stderr carries tau and the
drafter's name for every chain drafter (issue 3, item 6), and the text on stdout equals plain
decoding's at temperature 0. Tiny random models saved to a temporary directory, run through the
CLI the way a user runs it."""

from __future__ import annotations

import re

import pytest
import torch

from tests.models.hf_oracle import hf_config
from tests.train.tiny_target import byte_tokenizer, save_random_model, save_tiny_target
from treeflash.cli.main import main

SUMMARY = re.compile(r"^\[treeflash\] (\d+) tokens in .* tokens/s\)(?: tau (\d+\.\d\d) draft=(\S+))?$")
MAX_TOKENS = 40
PROMPT = "abcabcabcabc abcabc"


def save_mtp_target(path) -> str:
    """A random qwen3_5 (byte tokenizer, vocab 260) whose checkpoint carries mtp.* weights."""
    from safetensors.torch import load_file, save_file

    from treeflash.models.config import ModelConfig
    from treeflash.models.mtp import MTPHead

    tok = byte_tokenizer()
    cfg = hf_config("qwen3_5", vocab_size=len(tok) + 1, mtp_num_hidden_layers=1,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    save_random_model(cfg, tok, path, seed=0)
    head = MTPHead(ModelConfig.from_hf_dict(cfg.to_dict()), 1)
    weights = load_file(path / "model.safetensors")
    weights |= {f"mtp.{k}": (v + torch.randn_like(v) * 0.1).contiguous() for k, v in head.state_dict().items()}
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate_summary")
    return {
        "target": save_mtp_target(root / "target"),
        "draft": str(save_tiny_target(root / "draft", num_layers=1, seed=1)),  # another architecture, same tokenizer
    }


def generate(capsys, models, *extra: str) -> tuple[str, re.Match]:
    args = ["generate", "--model", models["target"], "--prompt", PROMPT, "--max-tokens", str(MAX_TOKENS),
            "--ignore-eos", "--quiet", "--device", "cpu", "--threads", "1", "--max-context", "256", *extra]
    assert main(args) == 0
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert lines, "no summary on stderr"
    m = SUMMARY.match(lines[-1])
    assert m, f"not a summary line: {lines[-1]!r}"
    assert int(m.group(1)) == MAX_TOKENS
    return out.out, m


@pytest.mark.parametrize("draft,draft_model", [("ngram", None), ("draft", "draft"), ("draft", "target"), ("mtp", None)])
def test_summary_reports_tau(capsys, models, draft, draft_model):
    plain, m = generate(capsys, models)
    assert m.group(2) is None  # plain decoding: no tau
    extra = ["--draft", draft, "--num-draft", "3"]
    if draft_model is not None:
        extra += ["--draft-model", models[draft_model]]
    spec, m = generate(capsys, models, *extra)
    assert spec == plain and len(plain.strip()) > 0  # lossless through the CLI
    assert m.group(2) is not None and m.group(3) == draft, "the summary lacks tau or the drafter's name"
    tau = float(m.group(2))
    assert 1.0 <= tau <= 4.0  # committed per pass: at least the bonus, at most 3 drafts + the bonus
    if draft_model == "target":
        # the target drafting for itself: every draft accepted, so the prefill token and then
        # ceil(39 / 4) = 10 passes of 4; the summary shows the run's real tau, 40 / 10
        assert m.group(2) == "4.00"
