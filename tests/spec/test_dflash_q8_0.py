"""--drafter-weights q8_0: the DFlash drafter's linear layers as Q8_0 blocks (load_dflash(weights="q8_0")) draft
what the float drafter drafts up to the quantization, and the planner counts the bytes they hold; a prefill
hands the drafter each chunk's rows (observe_prompt) and keeps none of them unless asked."""

from __future__ import annotations

import json

import torch
from gguf import GGMLQuantizationType, quants
from safetensors.torch import save_file

from tests.models.hf_oracle import make_pair
from tests.spec.test_dflash_model import random_drafter
from treeflash.models.quant_linear import QuantLinear
from treeflash.spec.dflash import DFlashDrafter
from treeflash.spec.dflash_model import load_dflash


def _checkpoint(tmp_path, target):
    model = random_drafter(target, target_layer_ids=(0, 1))
    c = model.config
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 4096, "vocab_size": target.config.vocab_size,
           "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": c.mask_token_id, "block_size": c.block_size}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    return model


def test_q8_0_drafter_is_close_to_the_float_one(tmp_path):
    _, target = make_pair("qwen3")
    ref = _checkpoint(tmp_path, target)
    fp, q8 = load_dflash(tmp_path), load_dflash(tmp_path, weights="q8_0")
    lins = [m for m in q8.modules() if isinstance(m, QuantLinear)]
    assert len(lins) == 1 + 7 * q8.config.num_layers and all(m.fmt == "Q8_0" for m in lins)
    want = quants.quantize(ref.fc.weight.detach().numpy(), GGMLQuantizationType.Q8_0)
    assert torch.equal(q8.fc.blocks, torch.from_numpy(want))  # gguf's quantizer, bit for bit
    assert q8.dtype == fp.dtype == torch.float32
    g = torch.Generator().manual_seed(0)
    ctx, block = torch.randn(9, 2 * 64, generator=g), torch.randn(8, 64, generator=g)
    with torch.no_grad():
        a, b = fp(ctx, block, fp.new_cache()), q8(ctx, block, q8.new_cache())
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
    # fused (the drafter fuses what it is given): q/k/v and gate/up in one QuantLinear each, same outputs
    DFlashDrafter(target, q8, budget=4)
    assert q8.layers[0].self_attn.qkv_packed is not None and q8.layers[0].mlp.gate_up_packed is not None
    with torch.no_grad():
        torch.testing.assert_close(q8(ctx, block, q8.new_cache()), b, rtol=1e-5, atol=1e-5)


def test_planner_counts_the_q8_0_blocks(tmp_path):
    from treeflash.models.memory.header import CheckpointHeader
    from treeflash.spec.drafter_memory import drafter_shape

    _, target = make_pair("qwen3")
    _checkpoint(tmp_path, target)
    header = CheckpointHeader("target", "safetensors", target.config, (), (), 0)
    q8 = load_dflash(tmp_path, weights="q8_0")
    held = sum(b.numel() * b.element_size() for b in q8.buffers() if b.dtype == torch.uint8)
    held += sum(p.numel() * 2 for p in q8.parameters())
    assert drafter_shape("dflash", str(tmp_path), header, 2, drafter_weights="q8_0").weights_bytes == held
    fp = drafter_shape("dflash", str(tmp_path), header, 2).weights_bytes
    assert fp == sum(p.numel() * 2 for p in load_dflash(tmp_path).parameters()) > held


def test_prompt_chunks_reach_the_drafter_and_are_not_kept():
    from treeflash.kv.cache import ModelCache  # noqa: F401 (the target's own cache)
    from treeflash.spec.decoder import Decoder
    from treeflash.spec.sampling import SamplingParams

    _, target = make_pair("qwen3")
    prompt = [int(t) for t in torch.randint(0, target.config.vocab_size - 2, (70,), generator=torch.Generator().manual_seed(3))]
    roots, lengths = [], []
    for chunk, keep in ((16, False), (1000, True)):
        drafter = DFlashDrafter(target, random_drafter(target, target_layer_ids=(0, 1)), budget=4)
        drafter.static_passes(128, use_graphs=False)  # beside static passes each chunk's rows are absorbed at once
        seen = []
        observe_prompt = drafter.observe_prompt
        drafter.observe_prompt = lambda ids, hidden: (seen.append(len(ids)), observe_prompt(ids, hidden))
        dec = Decoder(target, target.new_cache(128), SamplingParams(), drafter, keep_prompt_hidden=keep)
        roots.append(dec.prefill(prompt, chunk=chunk))
        assert sum(seen) == len(prompt) and len(seen) == -(-len(prompt) // chunk)
        assert (dec.prompt_hidden is not None) == keep
        lengths.append(drafter.cache.length + drafter.pending_rows())
        assert drafter.pending_rows() <= drafter.model.config.block_size  # the rest went into the draft cache
    assert roots[0] == roots[1] and lengths == [len(prompt)] * 2
