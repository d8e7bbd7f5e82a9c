"""The shipped DFlash drafter of the embedded default: `--draft dflash` with no other flag loads it,
and its output equals plain decoding at temperature 0 (through the CLI, the way a user runs it)."""

import pytest

from treeflash.cli.main import main
from treeflash.models.default_model import default_drafter_path, default_model_path, is_default_model


def test_the_drafter_ships_with_the_package():
    path = default_drafter_path()
    assert path is not None and (path / "config.json").is_file()
    assert sum(f.stat().st_size for f in path.glob("*.safetensors")) < 32 * 2**20
    assert all(f.stat().st_size < 15 * 2**20 for f in path.glob("*.safetensors"))  # small shards for the repository


def test_is_default_model(tmp_path):
    assert not is_default_model(None) and not is_default_model(tmp_path / "model.gguf")
    fake = tmp_path / default_model_path.__module__  # any other file
    fake.write_bytes(b"x")
    assert not is_default_model(fake)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["Write a Python function that checks whether a number is prime.",
                                    "What are three tips for staying focused while studying?"])
def test_generate_draft_dflash_equals_plain(prompt, capsys):
    args = ["generate", "--chat", prompt, "--max-tokens", "64", "--quiet", "--threads", "1", "--device", "cpu"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--draft", "dflash"]) == 0
    spec = capsys.readouterr()
    assert spec.out == plain and len(plain) > 40
    assert "dflash" in spec.err  # the summary names the drafter (and the budget auto chose)
