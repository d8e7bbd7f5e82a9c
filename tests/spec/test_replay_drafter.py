"""The replay drafter (an oracle for benchmarks): after one recorded pass it proposes the target's
own continuation, so greedy tau is exactly num_draft + 1; corrupted replays stay lossless; it is
labelled as an oracle."""

import pytest
import torch

from tests.models.hf_oracle import make_pair
from treeflash.errors import InvalidRequestError
from treeflash.spec.decoder import Decoder
from treeflash.spec.drafter import DraftOptions, build_drafter
from treeflash.spec.replay import ReplayDrafter
from treeflash.spec.sampling import SamplingParams


def run(model, prompt, n, drafter=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 80), SamplingParams(), drafter)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_replay_records_then_accepts_everything(arch):
    _, model = make_pair(arch)
    prompt = torch.randint(0, 97, (10,)).tolist()
    ref, _ = run(model, prompt, 64)
    drafter = ReplayDrafter(num_draft=7, vocab_size=model.config.vocab_size)
    first, s1 = run(model, prompt, 64, drafter)  # nothing recorded yet: plain steps, recorded through observe
    assert first == ref and s1.tau == 1.0
    second, s2 = run(model, prompt, 64, drafter)  # (prefill's reset stored the first pass)
    assert second == ref
    # every pass but the last one or two (where the record ends) accepted all 7 drafted tokens
    assert s2.accepted_per_depth[6] >= s2.passes - 2 and s2.tau > 6.0, (s2.tau, s2.accepted_per_depth)


def test_corrupted_replay_is_lossless_and_accepts_partially():
    _, model = make_pair("qwen3")
    prompt = torch.randint(0, 97, (10,)).tolist()
    ref, _ = run(model, prompt, 120)
    drafter = ReplayDrafter(num_draft=6, vocab_size=model.config.vocab_size, corrupt=0.3, seed=1)
    run(model, prompt, 120, drafter)
    out, stats = run(model, prompt, 120, drafter)
    assert out == ref
    assert 1.5 < stats.tau < 6.0  # some drafts cut short by a corrupted token, some accepted whole


def test_other_prompt_gets_no_draft_and_the_drafter_says_it_is_an_oracle():
    _, model = make_pair("llama")
    drafter = build_drafter("replay", type("L", (), {"config": model.config})(), DraftOptions(num_draft=4))
    assert drafter.describe()["oracle"] is True and "oracle" in drafter.describe()["note"]
    run(model, [1, 2, 3, 4, 5], 20, drafter)
    _, stats = run(model, [9, 8, 7, 6, 5], 20, drafter)  # not a recorded prefix: plain steps
    assert stats.tau == 1.0
    with pytest.raises(InvalidRequestError, match="replay-corrupt"):
        DraftOptions(replay_corrupt=1.5)


def test_a_shorter_pass_does_not_hide_the_longer_record():
    d = ReplayDrafter(num_draft=3, vocab_size=100)
    d.add_record([1, 2, 3, 4, 5, 6, 7, 8])
    d.add_record([1, 2, 3, 4])  # a prefix of the kept record: nothing to add
    d.add_record([9, 9])
    d.add_record([9, 9, 9])  # replaces its prefix [9, 9]
    assert d.records == [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9]]
