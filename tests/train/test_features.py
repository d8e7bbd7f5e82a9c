"""The transformers twin is the target: same features (at the DFlash layers, the last one after the
final norm, as DFlashDrafter sees them) and the same greedy answers under left padding."""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.test_lossless_greedy import run as decode
from treeflash.models.step import StepInput
from treeflash.train.features import TargetTwin




@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_5"])
def test_twin_features_and_greedy_answers_equal_the_target(arch):
    _, target = make_pair(arch, num_hidden_layers=4)
    last = target.config.num_layers - 1
    layers = (2, last, 0)
    twin = TargetTwin(target, layers, eos_ids=(96,), pad_id=0)
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding
    features = twin.capture(ids, mask)
    with torch.inference_mode():
        out = target(StepInput.plain(ids[1, :7], 0), target.new_cache(16), capture_layers=layers)
    ref = out.captured.clone()
    h = target.config.hidden_size
    ref[:, h : 2 * h] = target.model.norm(ref[:, h : 2 * h])  # the last layer, after the final norm
    torch.testing.assert_close(features[1, :7], ref, atol=1e-4, rtol=1e-4)
    prompts = [ids[0].tolist(), ids[1, :5].tolist()]  # different lengths: the shorter is left-padded
    for prompt, got in zip(prompts, twin.generate(prompts, 12)):
        want, _ = decode(target, prompt, 12)
        n = len(got.response_ids)
        assert got.response_ids == want[:n] and (got.finished or n == 12)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_twin_static_shape_generation_equals_dynamic(arch):
    """Every call padded to one (batch, width) shape on a static cache (what transformers compiles on
    CUDA) gives the same greedy answers as the dynamic cache; prompts that do not fit go dynamic."""
    _, target = make_pair(arch, num_hidden_layers=2)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 96, (n,), generator=g).tolist() for n in (9, 4, 13)]
    dynamic = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0)
    static = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, static_shape=(4, 16))
    want = dynamic.generate(prompts, 10)
    got = static.generate(prompts, 10)
    assert [x.response_ids for x in got] == [x.response_ids for x in want]
    assert [x.finished for x in got] == [x.finished for x in want] and static.static_shape == (4, 16)
    too_wide = [list(range(1, 20))]
    assert static.generate(too_wide, 5)[0].response_ids == dynamic.generate(too_wide, 5)[0].response_ids


def test_twin_static_failure_falls_back_to_dynamic_with_a_warning(monkeypatch):
    _, target = make_pair("qwen3", num_hidden_layers=2)
    twin = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, static_shape=(2, 8))
    real = twin._generate

    def fail_static(prompts, new, temp, seed, width=None):
        if width is not None:
            raise RuntimeError("no compile here")
        return real(prompts, new, temp, seed)

    monkeypatch.setattr(twin, "_generate", fail_static)
    with pytest.warns(UserWarning, match="static cache failed"):
        out = twin.generate([[5, 6, 7]], 4)
    assert len(out) == 1 and twin.static_shape is None


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_batch_generator_answers_equal_the_transformers_twin(arch):
    """treeflash's batched generator (static cache, the decode step that a CUDA graph captures, run
    eagerly here) gives the twin's greedy answers under left padding, end tokens included."""
    from treeflash.train.batch_gen import BatchGenerator

    _, target = make_pair(arch, num_hidden_layers=3)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 96, (n,), generator=g).tolist() for n in (9, 3, 14, 6)]
    twin = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, engine="hf")
    want = twin.generate(prompts, 20)
    # an end token the answers actually produce, so that rows stop at different steps
    eos = want[1].response_ids[4]
    twin = TargetTwin(target, (0,), eos_ids=(eos,), pad_id=0, engine="hf")
    want = twin.generate(prompts, 20)
    ours = TargetTwin(target, (0,), eos_ids=(eos,), pad_id=0, engine="treeflash")
    assert ours.engine == "treeflash" and isinstance(ours.batch_gen, BatchGenerator)
    got = ours.generate(prompts, 20)
    assert [x.response_ids for x in got] == [x.response_ids for x in want]
    assert [x.finished for x in got] == [x.finished for x in want] and any(x.finished for x in got)
    # one row alone gives the same answer as in the batch
    assert ours.generate([prompts[2]], 20)[0].response_ids == want[2].response_ids


def test_batch_generator_sampling_is_seeded_and_follows_the_distribution():
    """Gumbel-max sampling: the same seed gives the same answers; over many rows the first sampled
    token's frequencies match softmax(logits / T) (chi-square-style bound)."""
    from treeflash.train.batch_gen import BatchGenerator

    _, target = make_pair("qwen3", num_hidden_layers=2)
    gen = BatchGenerator(target, eos_ids=(), graphs=False)
    prompt = [5, 17, 33, 2]
    a = gen.generate([prompt] * 3, 6, temperature=0.9, seed=4)
    b = gen.generate([prompt] * 3, 6, temperature=0.9, seed=4)
    assert [x.response_ids for x in a] == [x.response_ids for x in b]
    n = 4000
    firsts = torch.tensor([x.response_ids[0] for x in gen.generate([prompt] * n, 1, temperature=0.9, seed=1)])
    with torch.inference_mode():
        logits = target(StepInput.plain(torch.tensor(prompt), 0), target.new_cache(8)).logits[-1]
    p = torch.softmax(logits / 0.9, -1)
    freq = torch.bincount(firsts, minlength=p.numel()).float() / n
    top = p.topk(5).indices
    assert ((freq[top] - p[top]).abs() <= 4 * (p[top] * (1 - p[top]) / n).sqrt() + 1e-3).all(), (freq[top], p[top])


def test_batch_generator_refuses_hybrid_targets():
    from treeflash.errors import ModelLoadError

    _, target = make_pair("qwen3_5", num_hidden_layers=2)
    with pytest.raises(ModelLoadError, match="gen-engine treeflash"):
        TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, engine="treeflash")
    assert TargetTwin(target, (0,), eos_ids=(96,), pad_id=0).engine == "hf"


def test_batch_generator_failure_falls_back_to_transformers_with_a_warning(monkeypatch):
    _, target = make_pair("llama", num_hidden_layers=2)
    twin = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, engine="treeflash")
    want = TargetTwin(target, (0,), eos_ids=(96,), pad_id=0, engine="hf").generate([[5, 6, 7]], 4)

    def boom(*a, **k):
        raise RuntimeError("CUDA graph capture failed")

    monkeypatch.setattr(twin.batch_gen, "generate", boom)
    with pytest.warns(UserWarning, match="batched generation failed"):
        out = twin.generate([[5, 6, 7]], 4)
    assert twin.engine == "hf" and twin.batch_gen is None
    assert out[0].response_ids == want[0].response_ids
