"""MTPHead: checkpoint names, shapes, its decoder layer equals transformers', and its own KV cache."""

import pytest
import torch
import torch.nn.functional as F

from treeflash.models.config import ModelConfig
from treeflash.models.mtp import MTPHead
from treeflash.models.transformer import CausalLM
from tests.models.hf_oracle import hf_config

LAYER_NAMES = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]
HEAD_NAMES = ["fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"]


def expected_names(num_layers: int) -> set[str]:
    return set(HEAD_NAMES) | {f"layers.{i}.{n}" for i in range(num_layers) for n in LAYER_NAMES}


@pytest.fixture(scope="module")
def hf_cfg():
    return hf_config("qwen3_5", num_hidden_layers=2, mtp_num_hidden_layers=1)


@pytest.fixture(scope="module")
def config(hf_cfg):
    return ModelConfig.from_hf_dict(hf_cfg.to_dict())


def random_head(config: ModelConfig, num_layers: int = 1) -> MTPHead:
    torch.manual_seed(2)
    head = MTPHead(config, num_layers).eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return head


def test_names_and_shapes(config):
    assert config.mtp_num_layers == 1
    head = MTPHead(config, 2)
    sd = head.state_dict()
    assert set(sd) == expected_names(2)
    h = config.hidden_size
    assert sd["fc.weight"].shape == (h, 2 * h)
    assert sd["layers.1.self_attn.q_proj.weight"].shape == (2 * config.num_heads * config.head_dim, h)  # gated output

    # the loader sets model.mtp: the checkpoint's mtp.* names then load by name
    model = CausalLM(config)
    model.mtp = MTPHead(config, config.mtp_num_layers)
    ckpt = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    assert {k for k in ckpt if k.startswith("mtp.")} == {f"mtp.{n}" for n in expected_names(1)}
    model.load_state_dict(ckpt, strict=True)
    assert torch.equal(model.mtp.fc.weight, ckpt["mtp.fc.weight"])


@torch.inference_mode()
def test_matches_transformers_decoder_layer(hf_cfg, config):
    """fc(cat(norm_e(e), norm_h(h))) by hand, then transformers' full-attention layer and final norm."""
    import transformers as tf

    torch.manual_seed(3)
    one_layer = {**hf_cfg.to_dict(), "num_hidden_layers": 1, "layer_types": ["full_attention"]}
    hf = tf.Qwen3_5TextModel(tf.Qwen3_5TextConfig(**one_layer)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    head = random_head(config)
    sd = {k: v for k, v in hf.state_dict().items() if k.startswith("layers.") or k == "norm.weight"}
    sd.update({n: head.state_dict()[n] for n in HEAD_NAMES if n != "norm.weight"})
    head.load_state_dict(sd, strict=True)

    n, h = 9, config.hidden_size
    emb, hidden = torch.randn(n, h), torch.randn(n, h)

    def unit_offset_rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * (1 + w)

    normed = (unit_offset_rms(emb, head.pre_fc_norm_embedding.weight), unit_offset_rms(hidden, head.pre_fc_norm_hidden.weight))
    x = F.linear(torch.cat(normed, dim=-1), head.fc.weight)  # embedding first, then hidden
    ref = hf(inputs_embeds=x[None]).last_hidden_state[0]
    out = head(emb, hidden, torch.arange(n), head.new_cache(32))
    assert out.shape == (n, h)
    assert (out - ref).abs().max().item() < 1e-5


@torch.inference_mode()
def test_incremental_and_truncate(config):
    head = random_head(config)
    n, h = 10, config.hidden_size
    emb, hidden, pos = torch.randn(n, h), torch.randn(n, h), torch.arange(n)
    full = head(emb, hidden, pos, head.new_cache(32))

    cache = head.new_cache(32)
    parts = [head(emb[:6], hidden[:6], pos[:6], cache)]
    for t in range(6, n):
        parts.append(head(emb[t : t + 1], hidden[t : t + 1], pos[t : t + 1], cache))
    assert cache.seq_len == n
    assert (torch.cat(parts) - full).abs().max().item() < 1e-5

    # drafted rows roll back: rerunning from the truncated cache gives the same output
    cache.truncate(6)
    again = head(emb[6:], hidden[6:], pos[6:], cache)
    assert (again - full[6:]).abs().max().item() < 1e-6

    logits = CausalLM(config).head(full)
    assert logits.shape == (n, config.vocab_size) and logits.dtype == torch.float32
