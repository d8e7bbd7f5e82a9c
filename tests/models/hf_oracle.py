"""Random tiny Hugging Face models (the oracle) and the same weights in treeflash's CausalLM."""

from __future__ import annotations

import torch

from treeflash.models.config import ModelConfig
from treeflash.models.transformer import CausalLM

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def hf_config(arch: str, **over):
    import transformers as tf

    kw = {**TINY, **over}
    if arch == "llama":
        return tf.LlamaConfig(**kw, rope_theta=10000.0)
    if arch == "qwen2":
        return tf.Qwen2Config(**kw, rope_theta=1000000.0)
    if arch == "qwen3":
        return tf.Qwen3Config(**kw, head_dim=32, rope_theta=1000000.0)
    if arch == "qwen3_5":
        kw["num_hidden_layers"] = over.get("num_hidden_layers", 4)  # linear, full, linear, full
        return tf.Qwen3_5TextConfig(
            **kw,
            head_dim=32,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            layer_types=[("linear_attention", "full_attention")[i % 2] for i in range(kw["num_hidden_layers"])],
        )
    raise ValueError(arch)


def make_pair(arch: str, dtype=torch.float32, **over):
    """(hf_model, our_model) with identical random weights, eval mode."""
    import transformers as tf

    cfg = hf_config(arch, **over)
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    with torch.no_grad():  # zero-init norms (qwen3_5) would hide bugs: randomize every parameter
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours = CausalLM(ModelConfig.from_hf_dict(cfg.to_dict())).to(dtype).eval()
    missing, unexpected = ours.load_state_dict(hf.state_dict(), strict=False)
    missing = [m for m in missing if not m.startswith("rotary")]
    assert not missing and not unexpected, (missing, unexpected)
    return hf, ours
