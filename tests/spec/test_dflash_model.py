"""DFlashModel equals z-lab's reference (`dflash` 0.1.0 on PyPI) and loads its checkpoints by name.

`random_drafter` is shared with test_dflash_lossless.py."""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.hf_oracle import make_pair
from treeflash.errors import ModelLoadError
from treeflash.models.step import StepInput
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.dflash_model import DFlashConfig, DFlashModel, load_dflash

H, VOCAB = 64, 97




def randomize(module: torch.nn.Module, scale: float = 0.1, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norm weights of ones would hide a missing norm: perturb everything
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def random_drafter(target, block_size: int = 8, num_layers: int = 2, seed: int = 1, **over) -> DFlashModel:
    """A random tiny DFlash drafter for `target` (a treeflash CausalLM)."""
    tc = target.config
    cfg = DFlashConfig(
        hidden_size=tc.hidden_size,
        intermediate_size=128,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mask_token_id=tc.vocab_size - 1,
        block_size=block_size,
        **{"target_layer_ids": (0, tc.num_layers - 2), **over},
    )
    model = DFlashModel(cfg).eval()
    randomize(model, seed=seed)
    return model


# -- parity with the reference ----------------------------------------------------------------

def ref_config(**over):
    import transformers as tf

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_target_layers=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dflash_config={"target_layer_ids": [0, 2], "mask_token_id": VOCAB - 1, "block_size": 4},
    )
    return tf.Qwen3Config(**{**kw, **over})


CONFIGS = {
    "full": {},
    "sliding": dict(use_sliding_window=True, sliding_window=5, max_window_layers=1),  # layer 1: causal, window 5
    "all_causal": dict(is_causal=True, use_sliding_window=True, sliding_window=6, layer_types=["sliding_attention", "full_attention"]),
    "scaled_logits": dict(
        attention_bias=True,
        dflash_config={"target_layer_ids": [0, 2], "mask_token_id": 3, "block_size": 5, "output_multiplier": 0.7, "final_logit_softcapping": 2.0},
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_reference_over_steps(name):
    ref_model = pytest.importorskip("dflash.model")
    cfg = ref_config(**CONFIGS[name])
    torch.manual_seed(0)
    ref = ref_model.DFlashDraftModel(cfg).eval()
    randomize(ref)
    ours = DFlashModel(DFlashConfig.from_dict(cfg.to_dict())).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    head = torch.nn.Linear(H, VOCAB, bias=False)
    b = ours.config.block_size
    ref_cache, cache = ref_model._make_cache(ref.config), ours.new_cache()
    start = 0
    with torch.no_grad():
        for n in (7, 3, 1, 4, 2, 5, 1):  # context rows committed before each step (the prompt, then 1 + accepted)
            ctx, block = torch.randn(1, n, 2 * H), torch.randn(1, b, H)
            start += n
            pos = torch.arange(start - n, start + b)[None]
            want = ref(target_hidden=ctx, noise_embedding=block, position_ids=pos, past_key_values=ref_cache, use_cache=True)
            ref_model._crop_to(ref_cache, start)
            got = ours(ctx[0], block[0], cache)
            assert cache.length == start
            torch.testing.assert_close(got, want[0], atol=1e-5, rtol=0)
            want_logits = ref.compute_logits(want[0, 1:], head)
            torch.testing.assert_close(ours.logits(got[1:], head), want_logits, atol=1e-4, rtol=0)


def test_loads_reference_checkpoint(tmp_path):
    ref_model = pytest.importorskip("dflash.model")
    cfg = ref_config(**CONFIGS["sliding"])
    ref = ref_model.DFlashDraftModel(cfg).eval()
    randomize(ref)
    ref.save_pretrained(tmp_path)
    ours = load_dflash(tmp_path)
    assert ours.config.layer_types == ("full_attention", "sliding_attention") and ours.config.sliding_window == 5
    assert ours.config.target_layer_ids == (0, 2) and ours.config.mask_token_id == VOCAB - 1 and ours.config.block_size == 4
    ctx, block = torch.randn(1, 9, 2 * H), torch.randn(1, 4, H)
    with torch.no_grad():
        want = ref(target_hidden=ctx, noise_embedding=block, position_ids=torch.arange(13)[None])
        got = ours(ctx[0], block[0], ours.new_cache())
    torch.testing.assert_close(got, want[0], atol=1e-5, rtol=0)


def test_end_to_end_drafts_equal_reference_generate():
    """Same target weights, same drafter weights: the reference's dflash_generate and our Decoder
    draft the same tokens at every step (context rows, positions, layer offsets all agree)."""
    ref_model = pytest.importorskip("dflash.model")
    from tests.spec.test_lossless_greedy import run

    hf, target = make_pair("qwen3")
    cfg = ref_config(dflash_config={"target_layer_ids": [0, 1], "mask_token_id": VOCAB - 1, "block_size": 6})
    ref = ref_model.DFlashDraftModel(cfg).eval()
    randomize(ref, scale=0.3)
    ours = DFlashModel(DFlashConfig.from_dict(cfg.to_dict())).eval()
    ours.load_state_dict(ref.state_dict())

    ref_drafts: list[list[int]] = []
    compute_logits = ref.compute_logits

    def record(hidden, head):
        logits = compute_logits(hidden, head)
        ref_drafts.append(logits.argmax(-1)[0].tolist())
        return logits

    ref.compute_logits = record
    prompt = torch.randint(0, VOCAB, (10,))
    n = 30
    ref_out = ref_model.dflash_generate(ref, hf, prompt[None], n, None)[0, 10:].tolist()

    drafter = DFlashDrafter(target, ours, budget=5, tree=False)
    our_drafts: list[list[int]] = []
    propose = drafter.propose

    def record_ours(ctx):
        tree = propose(ctx)
        our_drafts.append(tree.token_ids[1:].tolist())
        return tree

    drafter.propose = record_ours
    out, _ = run(target, prompt.tolist(), n, drafter)
    assert out == ref_out[:n]
    full = [d for d in ref_drafts if len(d) == 5]  # near max_new_tokens the reference shortens its blocks
    assert len(full) > 10 and our_drafts[: len(full)] == ref_drafts[: len(full)]


# -- our own invariants -------------------------------------------------------------------------

def test_incremental_cache_equals_recompute():
    """After a decode with multi-token commits, the cached draft context equals a fresh pass over
    every committed token's hidden states."""
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams

    _, target = make_pair("qwen3")
    model = random_drafter(target)
    drafter = DFlashDrafter(target, model, budget=64)
    prompt = torch.randint(0, VOCAB, (9,)).tolist()
    dec = Decoder(target, target.new_cache(200), SamplingParams(), drafter)
    dec.prefill(prompt)
    for _ in range(30):
        dec.step()
    assert dec.stats.accepted_per_depth and dec.stats.accepted_per_depth[0] > 0  # some steps committed 2+ tokens
    got = drafter.draft_logits(dec.root)

    fresh = DFlashDrafter(target, model, budget=4)
    with torch.inference_mode():
        out = target(StepInput.plain(torch.tensor(dec.tokens), 0), target.new_cache(len(dec.tokens)), capture_layers=fresh.capture_layers)
    fresh.observe(dec.tokens, out.captured)
    want = fresh.draft_logits(dec.root)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert drafter.cache.length == len(dec.tokens)


def test_absorbed_context_drafts_what_one_pass_over_it_drafts():
    """absorb (a prompt's rows beyond one static pass) writes the keys and values the pass itself
    would: absorbing all rows but the last, then drafting from that one, gives the logits of one
    eager pass over every row."""
    _, target = make_pair("qwen3")
    model = random_drafter(target, target_layer_ids=(0, 2))
    drafter = DFlashDrafter(target, model, budget=4)
    hidden = torch.randn(11, 2 * H, generator=torch.Generator().manual_seed(3))
    drafter.observe(list(range(11)), hidden)
    want = drafter.draft_logits(5)
    drafter.reset()
    model.absorb(drafter._prepare(hidden[:-1]), drafter.cache)
    assert drafter.cache.length == 10
    drafter._pending, drafter._observed = [hidden[-1:]], 11
    torch.testing.assert_close(drafter.draft_logits(5), want, atol=1e-5, rtol=0)
    assert drafter.cache.length == 11


def test_last_target_layer_is_read_after_the_final_norm():
    _, target = make_pair("qwen3")
    plain = DFlashDrafter(target, random_drafter(target, target_layer_ids=(0, 2)), budget=4)
    assert plain.normed_slot == 1  # layer 2 is the target's last: HF hands it over normed
    hidden = torch.randn(3, 2 * H)
    plain.observe([1, 2, 3], hidden)
    torch.testing.assert_close(plain._pending[0], hidden)  # kept raw; normalized when drafting
    ready = plain._prepare(hidden)
    torch.testing.assert_close(ready[:, H:], target.model.norm(hidden[:, H:]))
    torch.testing.assert_close(ready[:, :H], hidden[:, :H])


def test_config_errors(tmp_path):
    base = ref_config().to_dict()
    with pytest.raises(ModelLoadError, match="DFlash2"):
        DFlashConfig.from_dict({**base, "architectures": ["DFlash2DraftModel"]})
    with pytest.raises(ModelLoadError, match="target_layer_ids"):
        DFlashConfig.from_dict({**base, "dflash_config": {"mask_token_id": 1}})
    with pytest.raises(ModelLoadError, match="config.json"):
        load_dflash(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(base))
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_dflash(tmp_path)
    _, target = make_pair("qwen3")
    with pytest.raises(ModelLoadError, match="another target"):
        DFlashDrafter(target, random_drafter(target, target_layer_ids=(0, 7)))


def test_registry_builds_from_a_checkpoint(tmp_path):
    from types import SimpleNamespace

    from safetensors.torch import save_file

    from treeflash.spec.drafter import DraftOptions, build_drafter

    _, target = make_pair("qwen3")
    model = random_drafter(target)
    cfg = ref_config(dflash_config={"target_layer_ids": [0, 1], "mask_token_id": VOCAB - 1, "block_size": 8})
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors")
    loaded = SimpleNamespace(model=target, config=target.config)
    drafter = build_drafter("dflash", loaded, DraftOptions(draft_model=str(tmp_path), budget=12))
    info = drafter.describe()
    assert info["name"] == "dflash" and info["budget"] == 12 and info["block_size"] == 8 and info["tree"] is True
    with pytest.raises(ModelLoadError, match="draft-model"):
        build_drafter("dflash", loaded, DraftOptions())
