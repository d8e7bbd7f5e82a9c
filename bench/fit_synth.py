"""Random-weight checkpoints at real shapes for bench/fit_check.py: a Hugging Face directory
(config.json, a word-level tokenizer over the whole vocabulary, sharded bf16 safetensors) and a
DFlash drafter directory. Weights are drawn on the given device (the GPU writes 16 GB in seconds);
only their shapes matter to a memory check. Nothing here is a trained model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SHARD_BYTES = 4 << 30

# Shapes. qwen3-8b: Qwen3-8B's config, with a 128K position limit (so a 24 GiB card limits the context,
# not the model). hybrid-9b: a Qwen3.5-class hybrid (3 DeltaNet layers per attention layer) of ~9B.
SHAPES = {
    "qwen3-8b": {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                 "tie_word_embeddings": False, "eos_token_id": 151645},
    "hybrid-9b": {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                  "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                  "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4,
                  "partial_rotary_factor": 0.25, "max_position_embeddings": 262144, "rope_theta": 10000000.0,
                  "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "eos_token_id": 248044},
    # CPU checks of this script: the same structures, tiny
    "toy-dense": {"model_type": "qwen3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
                  "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "eos_token_id": 511},
    "toy-hybrid": {"model_type": "qwen3_5_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                   "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                   "linear_num_key_heads": 2, "linear_num_value_heads": 4, "full_attention_interval": 2,
                   "partial_rotary_factor": 0.25, "max_position_embeddings": 4096, "rope_theta": 10000.0,
                   "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "eos_token_id": 511},
}


def _random(shape: tuple[int, ...], name: str, device: str) -> torch.Tensor:
    if len(shape) == 1 and name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16, device=device)  # values are irrelevant; finite activations are not
    return (torch.randn(shape, device=device) * 0.02).to(torch.bfloat16)


def _save_sharded(shapes: dict[str, tuple[int, ...]], out: Path, device: str) -> None:
    from safetensors.torch import save_file

    shards, current, size = [], {}, 0
    for name, shape in shapes.items():
        n = 2 * torch.Size(shape).numel()
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = shape
        size += n
    shards.append(current)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: _random(s, n, device).cpu() for n, s in names.items()}, str(out / file))
        weight_map.update({n: file for n in names})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_tokenizer(vocab_size: int, eos_id: int, out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=f"w{eos_id}", unk_token="w0")
    tok.save_pretrained(str(out))


def write_hf(shape: str, out: Path, device: str = "cpu") -> Path:
    """A random-weight Hugging Face directory of SHAPES[shape] (reused when already written)."""
    from treeflash.models.config import ModelConfig
    from treeflash.models.transformer import CausalLM

    cfg = SHAPES[shape]
    if (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_hf_dict(cfg))
    _save_sharded({n: tuple(t.shape) for n, t in model.state_dict().items()}, out, device)
    write_tokenizer(cfg["vocab_size"], cfg["eos_token_id"], out)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def write_dflash(target_shape: str | dict, out: Path, num_layers: int = 5, device: str = "cpu") -> Path:
    """A random DFlash drafter directory for a target of SHAPES[target_shape] (or a dict of the same keys)
    (z-lab's layout: five layers reading five target layers, block size 16)."""
    from treeflash.spec.dflash_model import DFlashConfig, DFlashModel

    if (out / "config.json").is_file():
        return out
    t = SHAPES[target_shape] if isinstance(target_shape, str) else target_shape
    n = t["num_hidden_layers"]
    layers = sorted({1 + i * (n - 3) // 4 for i in range(5)})[:num_layers] if n >= 8 else list(range(min(n, 2)))
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": t["hidden_size"],
           "intermediate_size": t["intermediate_size"], "num_hidden_layers": num_layers if n >= 8 else 1,
           "num_attention_heads": 32 if n >= 8 else 4, "num_key_value_heads": 8 if n >= 8 else 2, "head_dim": 128 if n >= 8 else 16,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": t["max_position_embeddings"],
           "vocab_size": t["vocab_size"], "block_size": 16,
           "dflash_config": {"target_layer_ids": layers, "mask_token_id": t["vocab_size"] - 2, "block_size": 16}}
    with torch.device("meta"):
        model = DFlashModel(DFlashConfig.from_dict(cfg))
    out.mkdir(parents=True, exist_ok=True)
    _save_sharded({n: tuple(x.shape) for n, x in model.state_dict().items()}, out, device)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
