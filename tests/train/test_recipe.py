"""The DFlash training recipe: which context and which block rows each block sees, what it is
trained to predict, and that the batched training forward equals the drafter's inference forward."""

from __future__ import annotations

import math

import pytest
import torch

from tests.models.hf_oracle import make_pair
from treeflash.spec.dflash_model import DFlashModel
from treeflash.train.recipe import (
    IGNORE,
    accepted_lengths,
    block_attention_mask,
    block_loss,
    depth_weights,
    draft_hidden,
    drafter_config,
    make_blocks,
    sample_blocks,
    target_layer_ids,
)
from treeflash.train.trainer import init_weights




def test_target_layer_ids_follow_the_reference_spread():
    assert target_layer_ids(40, 4) == (1, 13, 25, 37)  # the reference's own test case
    assert target_layer_ids(30, 3) == (1, 14, 27)  # SmolLM2-135M, 3 draft layers
    assert target_layer_ids(64, 5) == (1, 16, 31, 46, 61)  # Qwen3.5-27B, 5 draft layers
    assert target_layer_ids(30, 1) == (15,)


def test_mask_block_sees_context_before_its_anchor_itself_and_no_other_block():
    anchors = torch.tensor([[3, 7, 9], [2, 4, 5]])
    t, b = 12, 4
    mask = block_attention_mask(anchors, t, b)
    assert mask.shape == (2, 3 * b, t + 3 * b)
    for s in range(2):
        for j in range(3):
            for k in range(b):
                row = mask[s, j * b + k]
                a = int(anchors[s, j])
                assert row[:t].tolist() == [c < a for c in range(t)]  # strictly before the anchor
                blocks = row[t:].view(3, b)
                assert blocks[j].all()  # its whole block, earlier and later rows: bidirectional
                assert not blocks[[i for i in range(3) if i != j]].any()  # other blocks invisible


def test_mask_causal_and_window_layers():
    anchors = torch.tensor([[6]])
    t, b = 8, 4
    mask = block_attention_mask(anchors, t, b, causal=True, window=3)[0]
    # query k at position 6 + k sees context c < 6 with 6 + k - c < 3, and block rows i <= k within the window
    for k in range(b):
        assert mask[k, :t].tolist() == [c < 6 and 6 + k - c < 3 for c in range(t)]
        assert mask[k, t:].tolist() == [i <= k and k - i < 3 for i in range(b)]


def test_blocks_inputs_labels_and_anchor_range():
    ids = torch.arange(100, 120)[None].repeat(2, 1)  # token at position p is 100 + p
    lengths = torch.tensor([20, 9])
    starts = torch.tensor([5, 6])
    blocks = sample_blocks(ids, lengths, starts, num_blocks=6, block_size=4, mask_token_id=0, generator=torch.Generator().manual_seed(1))
    for s in range(2):
        valid = blocks.anchors[s][blocks.valid[s]].tolist()
        assert valid == sorted(set(valid))  # distinct, sorted
        assert all(int(starts[s]) <= a < int(lengths[s]) - 1 for a in valid)  # in the response, >= 1 label
    assert int(blocks.valid[1].sum()) == 2  # positions 6, 7 only: the rest are padding blocks
    b = make_blocks(ids, lengths, torch.tensor([[5], [7]]), torch.tensor([[True], [True]]), 4, 0)
    assert b.input_ids.tolist() == [[105, 0, 0, 0], [107, 0, 0, 0]]
    assert b.positions.tolist() == [[5, 6, 7, 8], [7, 8, 9, 10]]
    assert b.labels.tolist() == [[[106, 107, 108]], [[108, IGNORE, IGNORE]]]  # past the end: ignored


def test_depth_weights_and_accepted_length():
    w = depth_weights(5, 2.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)]))
    assert depth_weights(5, None).tolist() == [1.0] * 4
    correct = torch.tensor([[[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]]], dtype=torch.bool)
    valid = torch.tensor([[True, True, False]])
    assert accepted_lengths(correct, valid).tolist() == [2.0, 0.0]  # the run of hits from depth 1


def _drafter(target, **over):
    cfg = drafter_config(target.config, num_layers=2, block_size=6, mask_token_id=96)
    if over:
        from dataclasses import replace

        cfg = replace(cfg, **over)
    model = DFlashModel(cfg)
    init_weights(model, seed=3, std=0.1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)  # norms of ones would hide a missing norm
    return model


@pytest.mark.parametrize("variant", ["full", "sliding_causal"])
def test_batched_training_forward_equals_inference_forward(variant):
    _, target = make_pair("llama", num_hidden_layers=6)
    over = {} if variant == "full" else dict(layer_types=("full_attention", "sliding_attention"), sliding_window=5)
    model = _drafter(target, **over)
    s_count, t = 2, 24
    features = torch.randn(s_count, t, 2 * target.config.hidden_size)
    ids = torch.randint(0, 96, (s_count, t))
    blocks = sample_blocks(ids, torch.tensor([24, 20]), torch.tensor([4, 9]), 3, 6, 96, torch.Generator().manual_seed(0))
    embeds = target.embed(blocks.input_ids)
    hidden = draft_hidden(model, features, embeds, blocks.positions, blocks.anchors)
    for s in range(s_count):
        for j in range(3):
            a = int(blocks.anchors[s, j])
            with torch.no_grad():  # one block over a fresh cache, exactly as DFlashDrafter drafts
                ref = model(features[s, :a], embeds[s, j * 6 : (j + 1) * 6], model.new_cache())
            torch.testing.assert_close(hidden[s, j * 6 : (j + 1) * 6], ref, atol=2e-5, rtol=1e-4)


def test_loss_reaches_every_drafter_parameter_and_not_the_target():
    _, target = make_pair("llama", num_hidden_layers=6)
    target.requires_grad_(False)
    model = _drafter(target)
    ids = torch.randint(0, 96, (2, 20))
    blocks = sample_blocks(ids, torch.tensor([20, 20]), torch.tensor([3, 3]), 4, 6, 96, torch.Generator().manual_seed(0))
    hidden = draft_hidden(model, torch.randn(2, 20, 128), target.embed(blocks.input_ids), blocks.positions, blocks.anchors)
    result = block_loss(lambda h: model.logits(h, target.head), hidden, blocks.labels, gamma=7.0)
    result.loss.backward()
    assert 3.0 < result.loss.item() < 6.0  # ~ln(97) at random init
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(p.grad is None for p in target.parameters())
    assert result.labelled.sum() == (blocks.labels != IGNORE).sum()


def test_too_many_draft_layers_for_a_shallow_target_is_a_clear_error():
    from treeflash.errors import InvalidRequestError
    from treeflash.train.recipe import target_layer_ids

    assert target_layer_ids(30, 3) == (1, 14, 27) and target_layer_ids(6, 2) == (1, 3)
    with pytest.raises(InvalidRequestError, match="--layers 2"):
        target_layer_ids(4, 2)


class _Tok:
    """The tokenizer surface pick_mask_token reads."""

    def __init__(self, tokens: list[str], added: dict[str, int], special: list[int], mask=None):
        self.tokens, self.added, self.all_special_ids, self.mask_token_id = tokens, added, special, mask
        self.bos_token_id = self.eos_token_id = self.pad_token_id = self.unk_token_id = None

    def __len__(self):
        return len(self.tokens)

    def convert_ids_to_tokens(self, i):
        return self.tokens[i]

    def get_added_vocab(self):
        return self.added


def test_mask_token_is_one_the_data_never_contains():
    from treeflash.train.recipe import pick_mask_token

    base = [f"t{i}" for i in range(20)]
    assert pick_mask_token(_Tok(base, {}, [], mask=7), 20) == 7  # the tokenizer's own
    assert pick_mask_token(_Tok(base, {}, []), 24) == 20  # embedding rows past the vocabulary
    # a GGUF vocabulary (Qwen2.5): chat tokens, then [PAD<n>] rows to the end -> the first pad row
    gguf = base[:15] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[PAD18]", "[PAD19]"]
    added = {"<|endoftext|>": 15, "<|im_start|>": 16, "<|im_end|>": 17}
    assert pick_mask_token(_Tok(gguf, added, [15, 17]), 20) == 18
    # no pad rows: the highest added token that is not special and not a chat control token
    # (<|im_start|> appears in every chat prompt)
    smol = base[:14] + ["<jupyter_code>", "<empty_output>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "t19"]
    added = {"<jupyter_code>": 14, "<empty_output>": 15, "<|endoftext|>": 16, "<|im_start|>": 17, "<|im_end|>": 18}
    assert pick_mask_token(_Tok(smol, added, [16, 18]), 20) == 15
    assert pick_mask_token(_Tok(base, {}, []), 20) == 19  # nothing else: the last id
