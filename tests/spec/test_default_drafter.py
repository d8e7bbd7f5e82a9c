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


@pytest.mark.slow
def test_auto_budget_across_requests_equals_plain():
    """--budget auto on the default pair (CPU, fp32), several requests through one engine (the bandit's
    prior carried from one to the next, code and chat prompts alternating): greedy output token-identical
    to plain decoding, and every request's per-step budgets in its usage."""
    import torch

    from treeflash.data.prompts import encode_prompt
    from treeflash.engine.engine import Engine, EngineConfig
    from treeflash.engine.request import GenerationRequest
    from treeflash.models.loader import load_model
    from treeflash.train.prompts import heldout_prompts

    loaded = load_model(None, device="cpu", dtype=torch.float32, progress=False)
    prompts = [p for p in heldout_prompts() if p.name.endswith(("/0", "/1", "HumanEval/3", "HumanEval/17"))]
    plain = Engine(loaded, EngineConfig(max_context=1024))
    auto = Engine(loaded, EngineConfig(max_context=1024, draft="dflash"))
    assert auto.drafter.describe()["budget_mode"] == "auto"
    for p in prompts:
        req = GenerationRequest(tuple(encode_prompt(loaded, p)), max_tokens=40, ignore_eos=True)
        _, want, _ = plain.complete(req)
        _, got, last = auto.complete(req)
        assert got == want, p.name
        budget = last.usage.spec["budget"]
        assert sum(budget["steps_per_budget"].values()) == last.usage.spec["passes"] == len(budget["per_step"])
    assert auto.drafter.tuner.prior.requests == len(prompts) - 1
