"""RoPE scaling (models/rope.py): frequencies equal transformers' for linear / llama3 / yarn, YaRN
checkpoints decode past their original context exactly as transformers does (from a Hugging Face
directory and from a GGUF with llama.cpp's rope.scaling.* keys), and a type we do not implement
is a load error naming it."""

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import RopeScalingType

from tests.models.hf_oracle import hf_config
from tests.models.test_loaders import random_hf, save_hf, write_gguf
from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.layers import Rotary
from treeflash.models.loader import load_model
from treeflash.spec.decoder import Decoder
from treeflash.spec.sampling import SamplingParams

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
SCALINGS = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    YARN,
    {**YARN, "beta_fast": 16.0, "beta_slow": 2.0},
    {**YARN, "attention_factor": 1.3},
    {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
]


def rope_config(arch, scaling, **over):
    cfg = hf_config(arch, **over)
    cfg.rope_parameters = {**cfg.rope_parameters, **scaling}
    return cfg


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_cos_sin_equal_transformers(arch, scaling):
    """The rotary table (frequencies and YaRN's attention factor) equals transformers' rotary_emb,
    partial rotary (qwen3_5: a quarter of head_dim, mrope sections) included."""
    import transformers as tf

    cfg = rope_config(arch, scaling)
    hf = tf.AutoModelForCausalLM.from_config(cfg).eval()
    ours = Rotary(ModelConfig.from_hf_dict(cfg.to_dict()))
    assert dict(ModelConfig.from_hf_dict(cfg.to_dict()).rope_scaling)["rope_type"] == scaling["rope_type"]
    positions = torch.arange(300)
    x = torch.zeros(1, 300, cfg.hidden_size)
    pos_ids = positions[None] if arch != "qwen3_5" else positions[None, None].expand(3, 1, -1)
    ref_cos, ref_sin = hf.model.rotary_emb(x, pos_ids)
    cos, sin = ours.cos_sin(positions, torch.float32)
    assert torch.allclose(cos, ref_cos[0], atol=2e-5) and torch.allclose(sin, ref_sin[0], atol=2e-5)


def greedy_ours(model, prompt, n):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 16), SamplingParams())
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n]


def greedy_theirs(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def yarn_qwen3():
    hf = random_hf("qwen3")
    hf.config.rope_parameters = {**hf.config.rope_parameters, **YARN}
    return type(hf)(hf.config).eval().requires_grad_(False), hf.state_dict()


def test_yarn_decodes_past_the_original_context_as_transformers(tmp_path, yarn_qwen3):
    """YaRN x4 over an original context of 64: a 90-token prompt and 40 greedy tokens (positions
    up to 130, twice the original context) equal transformers', from HF and from GGUF."""
    hf, sd = yarn_qwen3
    hf.load_state_dict(sd)
    prompt = torch.randint(0, 97, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = greedy_theirs(hf, prompt, 40)
    loaded = load_model(str(save_hf(hf, tmp_path / "hf")), device="cpu", progress=False)
    assert dict(loaded.config.rope_scaling) == YARN
    assert greedy_ours(loaded.model, prompt, 40) == ref

    def yarn_keys(w):
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(64)

    path = write_gguf(tmp_path / "yarn.gguf", hf, arch="qwen3", qtype=Q.F32, extra_meta=yarn_keys)
    from_gguf = load_model(str(path), device="cpu", progress=False)
    assert dict(from_gguf.config.rope_scaling) == YARN
    assert greedy_ours(from_gguf.model, prompt, 40) == ref


def test_unscaled_rope_differs_past_the_original_context(yarn_qwen3):
    """The check above can fail: the same weights without YaRN decode something else."""
    hf, sd = yarn_qwen3
    hf.load_state_dict(sd)
    prompt = torch.randint(0, 97, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    plain_cfg = ModelConfig.from_hf_dict({**hf.config.to_dict(), "rope_parameters": {"rope_theta": 1000000.0}})
    from treeflash.models.transformer import CausalLM

    plain = CausalLM(plain_cfg).eval()
    plain.load_state_dict(sd, strict=False)
    assert greedy_ours(plain, prompt, 40) != greedy_theirs(hf, prompt, 40)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope", "su"])
def test_unsupported_scaling_is_a_load_error(rope_type):
    cfg = hf_config("qwen3").to_dict()
    cfg["rope_parameters"] = {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ModelLoadError, match=f"rope scaling '{rope_type}' is not supported"):
        ModelConfig.from_hf_dict(cfg)


def test_old_style_rope_scaling_key():
    """config.json from before transformers 5: rope_scaling {"type": "yarn", ...} beside rope_theta."""
    cfg = {k: v for k, v in hf_config("qwen3").to_dict().items() if k != "rope_parameters"}
    cfg |= {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    c = ModelConfig.from_hf_dict(cfg)
    assert dict(c.rope_scaling) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768} and c.rope_theta == 1e6


def test_gguf_rope_scaling_keys(tmp_path):
    hf = random_hf("qwen2")

    def linear(w):
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)

    loaded = load_model(str(write_gguf(tmp_path / "lin.gguf", hf, arch="qwen2", extra_meta=linear)), device="cpu", progress=False)
    assert dict(loaded.config.rope_scaling) == {"rope_type": "linear", "factor": 2.0}

    def longrope(w):
        w.add_rope_scaling_type(RopeScalingType.LONGROPE)
        w.add_rope_scaling_factor(2.0)

    with pytest.raises(ModelLoadError, match="rope scaling 'longrope'.*rope.scaling.type"):
        load_model(str(write_gguf(tmp_path / "lr.gguf", hf, arch="qwen2", extra_meta=longrope)), device="cpu", progress=False)
