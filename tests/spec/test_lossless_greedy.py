"""Speculative greedy output is token-identical to plain greedy output, for every architecture,
and the runs that show it exercise zero, partial and full acceptance (so a verifier that never
accepts, or one that accepts everything, could not pass them)."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.oracle_drafter import OracleDrafter
from treeflash.spec.decoder import Decoder
from treeflash.spec.ngram import NgramDrafter
from treeflash.spec.sampling import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "qwen3_5"]


def run(model, prompt, n, drafter=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 80), SamplingParams(), drafter)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("width", [1, 3])
def test_oracle_drafter_is_lossless(arch, width):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (12,)).tolist()
    ref, _ = run(model, prompt, 200)
    out, stats = run(model, prompt, 200, OracleDrafter(model, depth=5, width=width, corrupt=0.4))
    assert out == ref
    assert stats.proposed_per_depth == [stats.passes] * 5  # every pass drafted the full depth, so:
    acc, rej = stats.accepted_per_depth, rejected_per_depth(stats)
    assert stats.tau > 1.5 and all(a > 0 for a in acc)  # some pass accepted a node at every depth 1..5,
    assert all(r > 0 for r in rej)  # some pass accepted d-1 nodes and rejected depth d, for every d,
    assert sum(rej) + acc[-1] == stats.passes  # and the passes without a rejection accepted all 5


def rejected_per_depth(stats) -> list[int]:
    """[d-1]: passes that reached depth d (accepted d-1 nodes) and accepted nothing there; valid when
    every pass drafted the full depth (proposed_per_depth constant)."""
    acc = stats.accepted_per_depth
    return [reached - a for reached, a in zip([stats.passes, *acc[:-1]], acc)]


class RecordingNgram(NgramDrafter):
    """NgramDrafter that records the depth of every chain it proposes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.depths: list[int] = []

    def propose(self, ctx):
        tree = super().propose(ctx)
        self.depths.append(tree.budget)
        return tree


@pytest.mark.parametrize("arch", ARCHS)
def test_ngram_is_lossless(arch):
    """The prompt is a permutation of the vocabulary: every token occurs once, so the lookup always
    finds at least a 1-gram match and proposes what followed it in the prompt, a decoy the target
    rejects. Once the target's output repeats itself (tiny random models fall into cycles), the
    lookup proposes the repetition and the target accepts it, fully inside a cycle and partly where
    the output leaves the part it matched."""
    _, model = make_pair(arch)
    prompt = torch.randperm(97, generator=torch.Generator().manual_seed(0)).tolist()
    ref, _ = run(model, prompt, 200)
    drafter = RecordingNgram(num_draft=4)
    dec = Decoder(model, model.new_cache(len(prompt) + 280), SamplingParams(), drafter)
    out, accepted = [dec.prefill(prompt)], []
    while len(out) < 200:
        committed = dec.step()
        accepted.append(len(committed) - 1)  # accepted drafts; the last token is the bonus
        out.extend(committed)
    assert out[:200] == ref
    passes = list(zip(drafter.depths, accepted))
    assert len(passes) == dec.stats.passes and all(0 <= a <= d for d, a in passes)
    assert any(0 == a < d for d, a in passes)  # zero acceptance: a decoy rejected at depth 1
    assert any(0 < a < d for d, a in passes)  # partial: accepted, then rejected within a chain
    assert any(0 < a == d for d, a in passes)  # full: the whole chain accepted
    # the run's SpecStats say the same: acceptance at depth 1, and drafts rejected
    stats = dec.stats
    assert stats.accepted_per_depth[0] > 0 and sum(stats.proposed_per_depth) > sum(stats.accepted_per_depth)
    assert stats.proposed_per_depth == [sum(d > i for d, _ in passes) for i in range(max(drafter.depths))]
    assert stats.accepted_per_depth == [sum(a > i for _, a in passes) for i in range(max(drafter.depths))]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_folded_norms_are_lossless(arch):
    """With the norms folded into the projections (forward_folded) for steps of 2..32 tokens, the
    verify steps take it (the 40-token prefill and the one-token steps do not); the stream is
    updated in place, so a layer that read it after its own add would break this."""
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    ref, _ = run(model, prompt, 120)
    model.fuse_projections(folded_rows=32)
    calls = []
    layer = model.model.layers[0]
    real = layer.forward_folded
    layer.forward_folded = lambda *a, **k: calls.append(1) or real(*a, **k)
    out, stats = run(model, prompt, 120, OracleDrafter(model, depth=5, width=3, corrupt=0.4))
    assert out == ref
    assert stats.tau > 1.5 and len(calls) == stats.passes  # every verify pass, and nothing else
