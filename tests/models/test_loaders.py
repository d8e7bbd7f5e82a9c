"""load_model reads Hugging Face directories and GGUF files into a CausalLM whose logits equal
transformers' on the same weights; a bad checkpoint fails with ModelLoadError naming file and tensor."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants

from tests.models.hf_oracle import hf_config
from treeflash.errors import ModelLoadError
from treeflash.models.loader import load_model
from treeflash.models.step import StepInput

VOCAB = 97


# -- fixtures: tiny checkpoints written the way transformers / llama.cpp write them --


def random_hf(arch: str, **over):
    import transformers as tf

    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(hf_config(arch, **over)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return hf


def hf_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB - 2)} | {"<s>": VOCAB - 2, "</s>": VOCAB - 1}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="w0")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def save_hf(hf, path, **kwargs):
    hf.save_pretrained(path, **kwargs)
    hf_tokenizer().save_pretrained(path)
    return path


def logits_of(model, ids):
    with torch.inference_mode():
        return model(StepInput.plain(ids, 0), model.new_cache(64)).logits


def assert_same_logits(hf, model):
    ids = torch.randint(0, VOCAB, (19,))
    with torch.inference_mode():
        ref = hf(ids[None]).logits[0].float()
    assert (logits_of(model, ids) - ref).abs().max().item() < 1e-4


GGUF_LEAF = {  # HF leaf -> llama.cpp leaf
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
}
QWEN35_LEAF = {"post_attention_layernorm.weight": "post_attention_norm.weight", "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if arch == "qwen35" and hf_name.startswith("model.layers."):
        _, _, layer, leaf = hf_name.split(".", 3)
        if leaf in QWEN35_LEAF:
            return f"blk.{layer}.{QWEN35_LEAF[leaf]}"
    base, _, suffix = hf_name.rpartition(".")
    if base in top:
        return f"{top[base]}.{suffix}"
    _, _, layer, leaf = base.split(".", 3)
    return f"blk.{layer}.{GGUF_LEAF[leaf]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to llama q/k rows: rotate-half pairs -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def qwen35_convert(hf_name: str, a: np.ndarray, cfg) -> np.ndarray:
    """What llama.cpp's converter does to Qwen3.5 tensors (undone by our loader, and by transformers')."""
    nk, nv, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_value_head_dim

    def tiled(x, head_dim=1):  # value heads grouped by key head (k0v0 k0v1 ..) -> tiled (v0k0 v0k1 ..)
        return x.reshape(nk, nv // nk, head_dim, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)

    qk = 2 * nk * cfg.linear_key_head_dim
    leaf = hf_name.split(".", 3)[-1] if hf_name.startswith("model.layers.") else hf_name
    if leaf.endswith("norm.weight") and "linear_attn" not in leaf:
        return a + 1.0  # zero-centred norms are stored as w + 1
    if leaf == "linear_attn.A_log":
        return tiled(-np.exp(a))
    if leaf in ("linear_attn.dt_bias", "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight"):
        return tiled(a)
    if leaf == "linear_attn.in_proj_z.weight":
        return tiled(a, dv)
    if leaf in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        a = a.reshape(a.shape[0], -1)  # conv1d: [C, 1, K] -> [C, K]
        return np.concatenate([a[:qk], tiled(a[qk:], dv)])
    if leaf == "linear_attn.out_proj.weight":
        return tiled(a.T, dv).T
    return a


def roundtrip(w: np.ndarray, qtype) -> np.ndarray:
    return quants.dequantize(quants.quantize(w, qtype), qtype).astype(np.float32)


GGUF_TOKENS = [chr(ord("!") + i) for i in range(VOCAB - 4)] + ["ab", "<s>", "</s>", "<unk>"]  # byte-level BPE


def write_gguf(path, hf, arch="llama", qtype=Q.Q8_0, drop=(), replace=None, extra_tensors=None, extra_meta=None):
    """Write `hf` as llama.cpp would; 2-D weights as `qtype` (the HF model is updated to the
    quantized values, so both sides run the same weights); returns the path. extra_meta(writer):
    adds metadata (rope scaling keys, nextn_predict_layers) before the header is written."""
    cfg = hf.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch == "qwen35":
        w.add_full_attention_interval(2)
        w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
        w.add_ssm_state_size(cfg.linear_key_head_dim)
        w.add_ssm_group_count(cfg.linear_num_key_heads)
        w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
        w.add_ssm_inner_size(cfg.linear_num_value_heads * cfg.linear_value_head_dim)
        w.add_rope_dimension_count(int(cfg.head_dim * cfg.rope_parameters["partial_rotary_factor"]))
        w.add_rope_dimension_sections([2, 1, 1, 0])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(GGUF_TOKENS)
    w.add_token_types([1] * (VOCAB - 3) + [3, 3, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(VOCAB - 3)
    w.add_eos_token_id(VOCAB - 2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    sd = hf.state_dict()
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    with torch.no_grad():
        for name, t in sd.items():
            a = t.float().numpy()
            quantize = a.ndim == 2 and qtype != Q.F32
            if quantize:
                a = roundtrip(a, qtype)
                t.copy_(torch.from_numpy(a))  # the reference runs the quantized weights too
            g = gguf_name(name, arch)
            if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
                a = llama_cpp_permute(a, heads if ".attn_q." in g else kv_heads)
            if arch == "qwen35":
                a = np.ascontiguousarray(qwen35_convert(name, a, cfg))
            if g in drop:
                continue
            if replace and g in replace:
                a, quantize = replace[g], False
            if quantize:
                w.add_tensor(g, quants.quantize(a, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(g, np.ascontiguousarray(a))
    for g, a in (extra_tensors or {}).items():
        w.add_tensor(g, a)
    if extra_meta is not None:
        extra_meta(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- Hugging Face directories --


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_hf_dir_matches_transformers(arch, tmp_path):
    hf = random_hf(arch)
    loaded = load_model(str(save_hf(hf, tmp_path)), device="cpu", progress=False)
    assert loaded.config.arch == arch and loaded.model.dtype == torch.float32
    assert_same_logits(hf, loaded.model)
    assert loaded.tokenizer.convert_tokens_to_ids(["w3", "</s>"]) == [3, VOCAB - 1]  # qwen2/3 get Qwen2Tokenizer
    assert loaded.chat_template.startswith("{% for m in messages %}")
    assert loaded.source == str(tmp_path)


def test_hf_sharded_and_tied(tmp_path):
    hf = random_hf("qwen3", tie_word_embeddings=True)
    save_hf(hf, tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    loaded = load_model(str(tmp_path), device="cpu", progress=False)
    assert loaded.model.lm_head is None
    assert_same_logits(hf, loaded.model)


def test_dtype_follows_request(tmp_path):
    hf = random_hf("llama")
    loaded = load_model(str(save_hf(hf, tmp_path)), device="cpu", dtype=torch.bfloat16, progress=False)
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.model.rotary.inv_freq.dtype == torch.float32


def test_vl_checkpoint_renames_skips_vision_and_loads_mtp(tmp_path):
    from safetensors.torch import save_file

    hf = random_hf("qwen3_5")
    text_cfg = hf.config.to_dict() | {"mtp_num_hidden_layers": 1}
    sd = {("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v for k, v in hf.state_dict().items()}
    sd["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3)
    from treeflash.models.config import ModelConfig
    from treeflash.models.mtp import MTPHead

    mtp = MTPHead(ModelConfig.from_hf_dict(text_cfg), 1)
    mtp_sd = {f"mtp.{k}": torch.randn_like(v) for k, v in mtp.state_dict().items()}
    save_file({k: v.contiguous() for k, v in (sd | mtp_sd).items()}, tmp_path / "model.safetensors")
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text_cfg, "vision_config": {"depth": 1}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", progress=False)
    assert loaded.config.arch == "qwen3_5" and loaded.config.mtp_num_layers == 1
    assert_same_logits(hf, loaded.model)
    assert torch.equal(loaded.model.mtp.fc.weight, mtp_sd["mtp.fc.weight"])


def test_hf_errors_name_file_and_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = random_hf("llama")
    save_hf(hf, tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as e:
        load_model(str(tmp_path), device="cpu", progress=False)
    assert str(tmp_path) in str(e.value)

    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 63)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"up_proj\.weight.*\(128, 63\)"):
        load_model(str(tmp_path), device="cpu", progress=False)

    sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 64)
    sd["model.layers.1.mlp.extra.weight"] = torch.zeros(3)
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"unexpected tensor model\.layers\.1\.mlp\.extra\.weight"):
        load_model(str(tmp_path), device="cpu", progress=False)


def test_bin_only_dir_is_refused(tmp_path):
    hf = random_hf("llama")
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_model(str(tmp_path), device="cpu", progress=False)


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(str(tmp_path / "nope.gguf"), device="cpu")
    (tmp_path / "weights.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="not a model"):
        load_model(str(tmp_path / "weights.txt"), device="cpu")


# -- GGUF files --


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda t: t.name)
def test_gguf_llama_matches_transformers(qtype, tmp_path):
    hf = random_hf("llama")
    path = write_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype)
    loaded = load_model(str(path), device="cpu", progress=False)
    assert loaded.config.arch == "llama" and not loaded.config.tie_word_embeddings
    assert_same_logits(hf, loaded.model)
    assert loaded.tokenizer("abc").input_ids == [GGUF_TOKENS.index("ab"), GGUF_TOKENS.index("c")]
    assert loaded.tokenizer.eos_token == "</s>" and loaded.tokenizer.bos_token == "<s>"
    assert loaded.config.eos_token_ids == (VOCAB - 2,)
    assert loaded.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_gguf_qwen3_tied(tmp_path):
    hf = random_hf("qwen3", tie_word_embeddings=True)
    loaded = load_model(str(write_gguf(tmp_path / "q3.gguf", hf, arch="qwen3")), device="cpu", progress=False)
    assert loaded.config.tie_word_embeddings and loaded.config.head_dim == 32
    assert_same_logits(hf, loaded.model)


def test_gguf_unknown_arch(tmp_path):
    path = write_gguf(tmp_path / "x.gguf", random_hf("llama"), arch="gpt2", qtype=Q.F32)
    with pytest.raises(ModelLoadError, match=r"x\.gguf.*unsupported GGUF architecture 'gpt2'"):
        load_model(str(path), device="cpu", progress=False)


def test_gguf_missing_tensor(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", random_hf("llama"), drop={"blk.1.attn_k.weight"})
    with pytest.raises(ModelLoadError, match=r"m\.gguf: missing tensor blk\.1\.attn_k\.weight"):
        load_model(str(path), device="cpu", progress=False)


def test_gguf_wrong_shape(tmp_path):
    bad = {"blk.2.ffn_up.weight": np.zeros((128, 32), dtype=np.float32)}
    path = write_gguf(tmp_path / "s.gguf", random_hf("llama"), replace=bad)
    with pytest.raises(ModelLoadError, match=r"s\.gguf: tensor blk\.2\.ffn_up\.weight .*\(128, 32\), expected \(128, 64\)"):
        load_model(str(path), device="cpu", progress=False)


def test_gguf_unexpected_tensor(tmp_path):
    path = write_gguf(tmp_path / "u.gguf", random_hf("llama"), extra_tensors={"blk.0.mystery.weight": np.zeros(4, np.float32)})
    with pytest.raises(ModelLoadError, match=r"u\.gguf: unexpected tensor blk\.0\.mystery\.weight"):
        load_model(str(path), device="cpu", progress=False)


def test_gguf_truncated(tmp_path):
    path = write_gguf(tmp_path / "t.gguf", random_hf("llama"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 3000])
    with pytest.raises(ModelLoadError, match=r"t\.gguf: truncated or corrupt: tensor \S+"):
        load_model(str(path), device="cpu", progress=False)
    path.write_bytes(data[:100])  # cut inside the metadata
    with pytest.raises(ModelLoadError, match=r"t\.gguf: not a readable GGUF file"):
        load_model(str(path), device="cpu", progress=False)


def allow_transformers_gguf(monkeypatch):
    """transformers refuses gguf_file= without `accelerate` installed, but its CPU path never uses it."""
    import transformers.modeling_utils

    monkeypatch.setattr(transformers.modeling_utils, "is_accelerate_available", lambda: True)


def test_gguf_qwen35_matches_transformers_and_its_gguf_reader(tmp_path, monkeypatch):
    """Our writer of llama.cpp's Qwen3.5 layout is checked by transformers' own GGUF reader."""
    import transformers as tf

    allow_transformers_gguf(monkeypatch)

    hf = random_hf("qwen3_5")
    path = write_gguf(tmp_path / "q35.gguf", hf, arch="qwen35", qtype=Q.F32)
    loaded = load_model(str(path), device="cpu", progress=False)
    assert loaded.config.arch == "qwen3_5" and loaded.config.layer_types == tuple(hf.config.layer_types)
    assert_same_logits(hf, loaded.model)
    theirs = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q35.gguf", dtype=torch.float32).eval()
    assert_same_logits(theirs, loaded.model)


def test_hf_dir_qwen3_5_text_matches_transformers(tmp_path):
    """A text-only Qwen3.5 directory (model_type qwen3_5_text, as save_pretrained writes the text
    model: weights under `model.*`, no `language_model` prefix, no vision tower) loads as qwen3_5."""
    hf = random_hf("qwen3_5")
    save_hf(hf, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_5_text"
    loaded = load_model(str(tmp_path), device="cpu", progress=False)
    assert loaded.config.arch == "qwen3_5" and loaded.config.layer_types == tuple(hf.config.layer_types)
    assert loaded.config.is_hybrid and loaded.config.rotary_dim == int(hf.config.head_dim * hf.config.rope_parameters["partial_rotary_factor"])
    assert loaded.config.num_kv_heads < loaded.config.num_heads  # grouped-query attention
    assert_same_logits(hf, loaded.model)


def test_gguf_qwen2_matches_transformers_and_its_gguf_reader(tmp_path, monkeypatch):
    """qwen2 in a GGUF: q/k/v biases, no q/k permutation (llama.cpp permutes llama only); checked
    against the HF model and against transformers' own reader of the same file."""
    import transformers as tf

    allow_transformers_gguf(monkeypatch)
    hf = random_hf("qwen2")
    path = write_gguf(tmp_path / "q2.gguf", hf, arch="qwen2")  # Q8_0 matrices, f32 biases and norms
    loaded = load_model(str(path), device="cpu", progress=False)
    assert loaded.config.arch == "qwen2" and loaded.config.attention_bias and not loaded.config.tie_word_embeddings
    assert loaded.config.rope_theta == 1000000.0
    assert_same_logits(hf, loaded.model)
    theirs = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q2.gguf", dtype=torch.float32).eval()
    assert_same_logits(theirs, loaded.model)
