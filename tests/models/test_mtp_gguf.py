"""MTP heads from GGUF in llama.cpp's layout (models/gguf_nextn.py): a random Qwen3.5 hybrid with a
random MTP head, written once as a Hugging Face directory (`mtp.*` safetensors) and once as a GGUF
with llama.cpp's nextn block (blk.{L}.nextn.eh_proj / enorm / hnorm / shared_head_norm plus the
block's decoder-layer tensors, `qwen35.nextn_predict_layers` = 1, block_count = L + 1). Both load
to the same target logits and the same MTP head logits, and `--draft mtp` on the GGUF decodes
exactly what plain decoding does at temperature 0."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants
from safetensors.torch import save_file

from tests.models.test_loaders import gguf_name, hf_tokenizer, qwen35_convert, random_hf, roundtrip, write_gguf
from treeflash.errors import ModelLoadError
from treeflash.models.config import ModelConfig
from treeflash.models.loader import load_model
from treeflash.models.mtp import MTPHead
from treeflash.models.step import StepInput
from treeflash.spec.decoder import Decoder
from treeflash.spec.mtp import MTPDrafter
from treeflash.spec.sampling import SamplingParams

HEAD_NEXTN = {  # ours -> (GGUF name, the name llama.cpp's converter passes on: its norms get + 1 by `endswith("norm.weight")`)
    "fc.weight": ("nextn.eh_proj", "eh_proj.weight"),
    "pre_fc_norm_embedding.weight": ("nextn.enorm", "enorm.weight"),
    "pre_fc_norm_hidden.weight": ("nextn.hnorm", "hnorm.weight"),
    "norm.weight": ("nextn.shared_head_norm", "shared_head.norm.weight"),
}


def random_mtp(hf, qtype):
    """A random MTP head's state dict (names without `mtp.`), 2-D weights rounded through `qtype`."""
    config = ModelConfig.from_hf_dict(hf.config.to_dict() | {"mtp_num_hidden_layers": 1})
    torch.manual_seed(5)
    head = MTPHead(config, 1)
    sd = {}
    for k, v in head.state_dict().items():
        v = v + torch.randn_like(v) * 0.1
        if v.dim() == 2 and qtype != Q.F32:
            v = torch.from_numpy(roundtrip(v.numpy(), qtype))
        sd[k] = v.contiguous()
    return sd


def nextn_tensors(mtp_sd, hf, qtype):
    """The head in llama.cpp's layout: what conversion/qwen.py's _Qwen35MtpMixin writes."""
    L, out = hf.config.num_hidden_layers, {}
    for k, v in mtp_sd.items():
        if k in HEAD_NEXTN:
            g, hf_name = f"blk.{L}.{HEAD_NEXTN[k][0]}.weight", f"model.layers.{L}.{HEAD_NEXTN[k][1]}"  # norms: w + 1
        else:
            hf_name = f"model.layers.{L}.{k[len('layers.0.'):]}"
            g = gguf_name(hf_name, "qwen35")
        a = np.ascontiguousarray(qwen35_convert(hf_name, v.numpy(), hf.config)).astype(np.float32)
        out[g] = (quants.quantize(a, qtype), qtype) if a.ndim == 2 and qtype != Q.F32 else (a, None)
    return out


def write_mtp_gguf(path, hf, mtp_sd, qtype=Q.Q8_0, mutate=None, template=None, vocab_size=None):
    tensors = nextn_tensors(mtp_sd, hf, qtype)
    if mutate:
        mutate(tensors)

    def meta(w):
        if template is not None:
            w.add_chat_template(template)
        if vocab_size is not None:  # a model vocabulary smaller than the writer's token list
            w.add_vocab_size(vocab_size)
        w.add_block_count(hf.config.num_hidden_layers + 1)  # llama.cpp counts the MTP block
        w.add_nextn_predict_layers(1)
        for g, (a, raw) in tensors.items():
            w.add_tensor(g, a, raw_dtype=raw) if raw is not None else w.add_tensor(g, a)

    return write_gguf(path, hf, arch="qwen35", qtype=Q.F32, extra_meta=meta)


def write_mtp_hf(path, hf, mtp_sd):
    path.mkdir()
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()} | {f"mtp.{k}": v for k, v in mtp_sd.items()}
    save_file(sd, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(hf.config.to_dict() | {"mtp_num_hidden_layers": 1}))
    hf_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mtp")
    hf = random_hf("qwen3_5")
    mtp_sd = random_mtp(hf, Q.Q8_0)
    from_gguf = load_model(str(write_mtp_gguf(tmp / "mtp.gguf", hf, mtp_sd)), device="cpu", progress=False)
    from_hf = load_model(str(write_mtp_hf(tmp / "hf", hf, mtp_sd)), device="cpu", progress=False)
    return from_gguf, from_hf


@torch.inference_mode()
def mtp_logits(model, ids):
    """Target logits [T, V] and the MTP head's logits [T - 1, V] over one prompt."""
    out = model(StepInput.plain(ids, 0), model.new_cache(64))
    n = ids.shape[0] - 1
    h = model.mtp(model.embed(ids[1:]), out.hidden[:n], torch.arange(n), model.mtp.new_cache(64))
    return out.logits, model.head(h)


def test_gguf_mtp_equals_safetensors_mtp(pair):
    from_gguf, from_hf = pair
    assert from_gguf.config.mtp_num_layers == 1 and from_gguf.config.num_layers == from_hf.config.num_layers
    assert from_gguf.model.mtp is not None
    for name, p in from_hf.model.mtp.state_dict().items():
        assert torch.allclose(from_gguf.model.mtp.state_dict()[name], p, atol=1e-6), name
    ids = torch.randint(0, 97, (23,), generator=torch.Generator().manual_seed(1))
    (lg, mg), (lh, mh) = mtp_logits(from_gguf.model, ids), mtp_logits(from_hf.model, ids)
    assert (lg - lh).abs().max() < 1e-4 and (mg - mh).abs().max() < 1e-4
    assert mg.std() > 0.1  # the head is not a constant: a wrong norm offset would show


def greedy(model, prompt, n, drafter=None):
    dec = Decoder(model, model.new_cache(len(prompt) + n + 16), SamplingParams(), drafter)
    out = [dec.prefill(prompt)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("num_draft", [1, 3, 5])
def test_draft_mtp_from_gguf_is_lossless(pair, num_draft):
    """The single MTP layer chained num_draft times (as llama.cpp's --spec-draft-n-max does)."""
    model = pair[0].model
    prompt = torch.randint(0, 97, (15,), generator=torch.Generator().manual_seed(2)).tolist()
    ref, _ = greedy(model, prompt, 60)
    out, stats = greedy(model, prompt, 60, MTPDrafter(model, num_draft))
    assert out == ref
    assert stats.proposed_per_depth[:num_draft] == [stats.passes] * num_draft  # every pass drafted num_draft tokens


def test_missing_and_unexpected_nextn_tensors(tmp_path):
    hf = random_hf("qwen3_5")
    mtp_sd = random_mtp(hf, Q.F32)
    L = hf.config.num_hidden_layers
    with pytest.raises(ModelLoadError, match="nextn.eh_proj|mtp.fc"):
        load_model(str(write_mtp_gguf(tmp_path / "a.gguf", hf, mtp_sd, Q.F32, lambda t: t.pop(f"blk.{L}.nextn.eh_proj.weight"))),
                   device="cpu", progress=False)
    with pytest.raises(ModelLoadError, match="own embedding"):
        load_model(str(write_mtp_gguf(tmp_path / "b.gguf", hf, mtp_sd, Q.F32,
                                      lambda t: t.update({f"blk.{L}.nextn.embed_tokens.weight": (np.zeros((97, 64), np.float32), None)}))),
                   device="cpu", progress=False)


@pytest.mark.parametrize("tree_budget", [None, 5])
def test_sampled_draft_mtp_from_gguf_matches_the_target(tmp_path, tree_budget):
    """Sampling through the GGUF's MTP head (a chain with draft probabilities: rejection sampling;
    --mtp-tree: sample-and-match) draws exactly the target's distribution: tests/spec/test_sampled.py's
    chi-square test, on an 8-token Qwen3.5 hybrid (linear, full) written in llama.cpp's layout."""
    from tests.spec.test_sampled import HEAD_GAIN, T1, VOCAB, statistic

    hf = random_hf("qwen3_5", vocab_size=VOCAB, num_hidden_layers=2)
    with torch.no_grad():
        hf.lm_head.weight.mul_(HEAD_GAIN * 20)  # random_hf's weights are small: sharpen to ~1 nat of entropy
    mtp_sd = random_mtp(hf, Q.F32)
    model = load_model(str(write_mtp_gguf(tmp_path / "v8.gguf", hf, mtp_sd, Q.F32, vocab_size=VOCAB)), device="cpu", progress=False).model
    assert model.config.vocab_size == VOCAB and model.mtp is not None
    stat, limit = statistic(model, MTPDrafter(model, 2, tree_budget), T1)
    assert stat < limit, f"chi-square {stat:.1f} >= {limit:.1f}"
