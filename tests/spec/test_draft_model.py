"""`draft` drafter: lossless for every architecture (attention and hybrid drafts), its cache follows
the commits exactly (each proposal equals the draft model's greedy continuation computed from
scratch), sampled chains carry child_probs, and vocabularies are checked."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tests.models.hf_oracle import hf_config
from treeflash.errors import InvalidRequestError, ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM
from treeflash.spec.decoder import Decoder
from treeflash.spec.draft_model import DraftModelDrafter, check_vocab
from treeflash.spec.drafter import DraftContext, DraftOptions, build_drafter
from treeflash.spec.sampling import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "qwen3_5"]


def random_prompt(n: int, vocab: int = 97, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def tiny_lm(arch: str, seed: int, scale: float = 0.02, **over) -> CausalLM:
    """A random tiny CausalLM (tests/models/hf_oracle sizes); every parameter perturbed by `scale`."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the default init draws from the global generator
        model = CausalLM(ModelConfig.from_hf_dict(hf_config(arch, **over).to_dict())).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * scale)
    return model


def noisy_copy(model: CausalLM, noise: float, seed: int) -> CausalLM:
    """A draft that agrees with the target often but not always: its weights plus relative noise."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return draft


def run(model, prompt, n, drafter=None, params=SamplingParams(), generator=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 16), params, drafter, generator=generator)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_is_lossless(arch):
    target = tiny_lm(arch, 0, scale=0.06)  # large enough that the output does not settle into a short cycle
    prompt = random_prompt(12)
    ref, _ = run(target, prompt, 200)
    out, stats = run(target, prompt, 200, DraftModelDrafter(noisy_copy(target, 0.2, 1), 4, 97))
    assert out == ref
    assert stats.tau > 1.3 and stats.accepted_per_depth[-1] > 0  # drafts were accepted, up to full depth
    assert stats.passes > stats.accepted_per_depth[0]  # and rejected at the root too


@pytest.mark.parametrize("target_arch,draft_arch", [("qwen3_5", "llama"), ("llama", "qwen3_5")])
def test_draft_of_another_architecture_and_smaller_vocab(target_arch, draft_arch):
    """A draft of another architecture, one layer fewer, and a smaller (prefix) vocabulary."""
    target = tiny_lm(target_arch, 0)
    draft = tiny_lm(draft_arch, 5, num_hidden_layers=2, vocab_size=90)
    prompt = random_prompt(10, 90)
    ref, _ = run(target, prompt, 200)
    out, _ = run(target, prompt, 200, DraftModelDrafter(draft, 3, 97))
    assert out == ref


class Recorder(DraftModelDrafter):
    """Keeps every (context, proposal) pair for a check against a from-scratch greedy run."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen = []

    def propose(self, ctx):
        tree = super().propose(ctx)
        self.seen.append((list(ctx.tokens) + [ctx.root], tree.token_ids[1:].tolist()))
        return tree


@torch.inference_mode()
def greedy_from_scratch(model, seq, k):
    cache = model.new_cache(len(seq) + k)
    out = model(StepInput.plain(torch.tensor(seq), 0), cache)
    toks = []
    for _ in range(k):
        toks.append(int(out.logits[-1].argmax()))
        out = model(StepInput.plain(torch.tensor(toks[-1:]), cache.seq_len), cache)
    return toks


@pytest.mark.parametrize("draft_arch", ["llama", "qwen3_5"])  # truncate + feed, and verify chains + commit
def test_proposals_follow_the_commits(draft_arch):
    target = tiny_lm(draft_arch, 0)
    drafter = Recorder(noisy_copy(target, 0.1, 3), 4, 97)
    prompt = random_prompt(9)
    run(target, prompt, 60, drafter)
    run(target, random_prompt(20, seed=1), 30, drafter)  # a second sequence: reset; the prompt is read in observe
    assert len(drafter.seen) > 10
    for seq, proposal in drafter.seen:
        assert proposal == greedy_from_scratch(drafter.model, seq, 4)


@torch.inference_mode()
def test_sampled_chain_carries_its_distributions():
    target = tiny_lm("llama", 0)
    drafter = DraftModelDrafter(tiny_lm("llama", 1, vocab_size=90), 5, 97)
    params = SamplingParams(temperature=1.0, top_k=20)
    g = torch.Generator().manual_seed(0)
    drafter.observe(list(range(10)), None)
    tree = drafter.propose(DraftContext(list(range(10)), 3, params, g, max_nodes=4))  # room caps the chain
    assert tree.is_chain() and tree.num_nodes == 4
    q = tree.child_probs
    assert q.shape == (4, 97)
    assert torch.allclose(q[:3].sum(-1), torch.ones(3)) and not q[3].any()
    assert not q[:, 90:].any()  # ids the draft cannot produce
    assert ((q[:3] > 0).sum(-1) <= 20).all()  # top-k applied
    drafts = tree.token_ids[1:]
    assert (q[torch.arange(3), drafts] > 0).all()  # each token drawn from its row


def loaded(model, vocab: dict | None, source: str):
    tok = None if vocab is None else SimpleNamespace(get_vocab=lambda: dict(vocab))
    return SimpleNamespace(model=model, config=model.config, tokenizer=tok, source=source)


def test_vocabulary_checks():
    words = {f"w{i}": i for i in range(97)}
    target = loaded(tiny_lm("llama", 0), words, "target.gguf")
    check_vocab(target, loaded(tiny_lm("qwen2", 1), words, "same.gguf"))
    check_vocab(target, loaded(tiny_lm("qwen2", 1, vocab_size=90), {w: i for w, i in words.items() if i < 90}, "prefix.gguf"))
    swapped = {**words, "w3": 4, "w4": 3}
    with pytest.raises(ModelLoadError, match="disagrees.*'w3': draft 4 / target 3"):
        check_vocab(target, loaded(tiny_lm("qwen2", 1), swapped, "swapped.gguf"))
    with pytest.raises(ModelLoadError, match="larger than the target"):
        check_vocab(target, loaded(tiny_lm("qwen2", 1, vocab_size=100), None, "big.gguf"))
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        check_vocab(loaded(tiny_lm("llama", 0), None, "t"), loaded(tiny_lm("qwen2", 1, vocab_size=90), None, "d"))


def test_registry_builds_it(monkeypatch):
    words = {f"w{i}": i for i in range(97)}
    target = loaded(tiny_lm("llama", 0), words, "target.gguf")
    draft = loaded(tiny_lm("qwen3", 1), words, "draft.gguf")
    calls = []

    def fake_load(path, device, dtype, progress, weights="float"):
        calls.append((path, device, dtype))
        return draft

    monkeypatch.setattr("treeflash.models.loader.load_model", fake_load)
    drafter = build_drafter("draft", target, DraftOptions(num_draft=3, draft_model="draft.gguf"))
    assert isinstance(drafter, DraftModelDrafter) and drafter.num_draft == 3
    assert calls == [("draft.gguf", target.model.device, target.model.dtype)]
    assert drafter.describe()["draft_model"] == "draft.gguf"
    with pytest.raises(InvalidRequestError, match="--draft-model"):
        build_drafter("draft", target, DraftOptions())
    draft.tokenizer = SimpleNamespace(get_vocab=lambda: {**words, "w0": 1, "w1": 0})
    with pytest.raises(ModelLoadError, match="disagrees"):
        build_drafter("draft", target, DraftOptions(draft_model="draft.gguf"))
