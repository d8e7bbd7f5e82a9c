"""Write a trained drafter in z-lab's DFlash checkpoint format (what `--draft dflash --draft-model DIR` loads).

config.json: a Qwen3 config plus `dflash_config` {target_layer_ids, mask_token_id, block_size},
as `DFlashDraftModel.save_pretrained` writes it; tensors under the reference's names (`fc.weight`,
`layers.{i}.self_attn.q_proj.weight`, ...) in model.safetensors, or, when `max_shard_bytes` is
given and the weights exceed it, in model-0000i-of-0000n.safetensors shards with the standard
model.safetensors.index.json. Files are written to a temporary folder inside out_dir and renamed
into place (out_dir may hold other things: the trainer keeps its work under out_dir/train).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from treeflash.spec.dflash_model import DFlashConfig, DFlashModel

INDEX_FILE = "model.safetensors.index.json"


def config_dict(c: DFlashConfig, num_target_layers: int, vocab_size: int, dtype: torch.dtype, extra: dict | None = None) -> dict[str, Any]:
    rope = c.rope
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "attention_bias": c.attention_bias,
        "attention_dropout": 0.0,
        "max_position_embeddings": rope.max_position_embeddings,
        "rope_theta": rope.rope_theta,
        "rope_scaling": dict(rope.rope_scaling) or None,
        "use_sliding_window": c.sliding_window is not None,
        "sliding_window": c.sliding_window,
        "layer_types": list(c.layer_types),
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "num_target_layers": num_target_layers,
        "block_size": c.block_size,
        "dflash_config": {
            "target_layer_ids": list(c.target_layer_ids),
            "mask_token_id": c.mask_token_id,
            "block_size": c.block_size,
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if extra:
        cfg["treeflash"] = extra  # provenance: target, data, steps (ignored by loaders)
    return cfg


def export_drafter(
    model: DFlashModel,
    out_dir: str | Path,
    num_target_layers: int,
    vocab_size: int,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int | None = None,
    extra: dict | None = None,
) -> list[str]:
    """Write config.json + safetensors into out_dir (replacing what was there); returns the file names."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".export.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {n: t.detach().to("cpu", dtype).contiguous() for n, t in model.state_dict().items()}
    shards = _shard(tensors, max_shard_bytes)
    meta = {"format": "pt"}
    if len(shards) == 1:
        names = ["model.safetensors"]
        save_file(shards[0], str(tmp / names[0]), metadata=meta)
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map = {}
        for name, shard in zip(names, shards):
            save_file(shard, str(tmp / name), metadata=meta)
            weight_map.update({t: name for t in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (tmp / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        names.append(INDEX_FILE)
    cfg = config_dict(model.config, num_target_layers, vocab_size, dtype, extra)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    # drop the previous export's weights, then move the new files in (each rename is atomic)
    for old in [*out.glob("*.safetensors"), out / INDEX_FILE]:
        if old.name not in names and old.exists():
            old.unlink()
    for name in [*names, "config.json"]:
        (tmp / name).chmod(0o644)  # safetensors creates its files private
        (tmp / name).replace(out / name)
    tmp.rmdir()
    return ["config.json", *names]


def _shard(tensors: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Greedy in name order; a tensor larger than max_bytes gets a shard of its own."""
    if max_bytes is None:
        return [tensors]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards
