"""GGUF weights kept in their stored blocks (models/quant_linear.py) compute what the dequantized model
computes: per layer against F.linear over gguf's dequantized weight, per model against the same file
loaded dequantized (logits within fp32 rounding), fused or not; a type nothing reads is refused by name."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

from treeflash.errors import ModelLoadError
from treeflash.models.gguf_synth import random_blocks, write_synth_gguf
from treeflash.models.layers import PackedRuns
from treeflash.models.loader import build_model, load_model, open_checkpoint
from treeflash.models.quant_linear import QuantLinear
from treeflash.models.step import StepInput

FORMATS = [T.Q8_0, T.Q4_0, T.Q5_1, T.Q3_K, T.Q4_K, T.Q6_K, T.IQ4_XS, T.IQ2_XXS]


def _layer(qtype, n=24, k=512, seed=0, **kw) -> tuple[QuantLinear, torch.Tensor]:
    blocks = random_blocks(qtype, (n, k), np.random.default_rng(seed))
    w = torch.from_numpy(quants.dequantize(blocks, qtype))  # [n, k] fp32: gguf's reference
    return QuantLinear(torch.from_numpy(blocks), qtype.name, k, **kw), w


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_quant_linear_equals_dequantized_linear(qtype):
    lin, w = _layer(qtype)
    x = torch.randn(3, 7, 512)
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-6)
    assert torch.equal(lin.dequantized(), w)
    assert lin.weight_bytes() == lin.blocks.numel() < w.numel() * 4


def test_bias_input_gather_and_concat():
    bias = torch.randn(24)
    perm = torch.randperm(512)
    lin, w = _layer(T.Q4_K, bias=bias, in_index=torch.argsort(perm))
    x = torch.randn(5, 512)
    torch.testing.assert_close(lin(x), F.linear(x, w[:, perm], bias), rtol=1e-5, atol=1e-5)  # the model's column order
    assert torch.equal(lin.dequantized(), w[:, perm])

    a, wa = _layer(T.Q6_K, n=16, seed=1)
    b, wb = _layer(T.Q6_K, n=8, seed=2)
    c, _ = _layer(T.Q8_0, n=8, seed=3)
    assert QuantLinear.concat([a, c]) is None and QuantLinear.concat([lin, lin]) is None  # formats / gathers differ
    fused = QuantLinear.concat([a, b])
    torch.testing.assert_close(fused(x), F.linear(x, torch.cat([wa, wb])), rtol=1e-5, atol=1e-5)
    assert a.blocks.untyped_storage().data_ptr() == fused.blocks.untyped_storage().data_ptr()  # the parts are views
    torch.testing.assert_close(b(x), F.linear(x, wb), rtol=1e-5, atol=1e-5)


def test_quant_tuning_is_passed_down_to_every_layer_and_kept_by_concat():
    from torch import nn

    from treeflash.kernels.quant.config import DEFAULT_TUNING, QuantTuning
    from treeflash.models.quant_linear import set_quant_tuning

    a, wa = _layer(T.Q4_K, n=16, seed=1)
    b, wb = _layer(T.Q4_K, n=8, seed=2)
    assert a.tuning is DEFAULT_TUNING and DEFAULT_TUNING.q4k_gemv_route == "dp4a"
    tuning = QuantTuning(q4k_gemv_route="q4k", q4k_rows_route="generic")
    assert set_quant_tuning(nn.Sequential(a, nn.ReLU(), b), tuning) == 2
    assert a.tuning is tuning and b.tuning is tuning
    fused = QuantLinear.concat([a, b])
    assert fused.tuning is tuning
    x = torch.randn(1, 512)  # off CUDA (no interpreter) every route is the reference path: the same result
    torch.testing.assert_close(fused(x), F.linear(x, torch.cat([wa, wb])), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="q4k_gemv_route must be one of words, bytes, q4k, mma, dp4a"):
        QuantTuning(q4k_gemv_route="rows")


def test_bad_blocks_raise():
    with pytest.raises(ValueError, match="do not hold rows of 500 values"):
        QuantLinear(torch.zeros(4, 144, dtype=torch.uint8), "Q4_K", 500)


def _logits(model, ids):
    with torch.inference_mode():
        return model(StepInput.plain(ids, 0), model.new_cache(64)).logits


@pytest.mark.parametrize("shape,mix", [("tiny-hybrid", "q4_k_m"), ("tiny-hybrid", "ud-q3_k_xl"), ("tiny-dense", "q4_k_m"),
                                       ("tiny-llama", "q6_k")])
def test_model_on_stored_blocks_equals_dequantized(shape, mix, tmp_path):
    """Row fix-ups (llama q/k, qwen35 value heads) move block rows, the column one (ssm_out) gathers the input."""
    path = write_synth_gguf(tmp_path / f"{shape}.gguf", shape, mix)
    ids = torch.randint(0, 512, (11,))
    ref = _logits(load_model(str(path), device="cpu", progress=False).model, ids)
    assert ref.isfinite().all() and ref.std() > 0
    model = build_model(open_checkpoint(path), torch.device("cpu"), torch.float32, progress=False, keep_quantized=lambda fmt: True)
    quant = [m for m in model.modules() if isinstance(m, QuantLinear)]
    # every matrix kept, but the MTP head's (MTPHead reads fc.weight: it stays float)
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and not n.startswith("mtp")]
    assert isinstance(model.lm_head, QuantLinear)
    torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)
    model.fuse_projections()
    assert not model.foldable()
    torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)
    if shape == "tiny-hybrid" and mix == "q4_k_m":  # q/k Q4_K + v Q6_K; DeltaNet qkv/z Q4_K + alpha/beta Q8_0
        assert isinstance(model.model.layers[0].linear_attn.in_proj_packed, PackedRuns)
        assert [r.fmt for r in model.model.layers[0].linear_attn.in_proj_packed.runs] == ["Q4_K", "Q8_0"]
        assert isinstance(model.model.layers[0].mlp.gate_up_packed, QuantLinear)


def test_native_on_cpu_keeps_4bit_layers_and_reports_the_plan(tmp_path):
    path = write_synth_gguf(tmp_path / "q40.gguf", "tiny-llama", "q4_0")
    loaded = load_model(str(path), device="cpu", progress=False, weights="native")
    from treeflash.models.int4_linear import Int4Linear

    assert any(isinstance(m, Int4Linear) for m in loaded.model.modules())
    assert loaded.weight_plan["Q4_0"] == {"quantized": 15, "dequantized": 1}  # 2 layers x 7 matrices + the head; the embedding
    assert not any(isinstance(m, QuantLinear) for m in loaded.model.modules())  # nothing dequantizes per call on the CPU
    ref = load_model(str(path), device="cpu", progress=False)
    assert ref.weight_plan == {"Q4_0": {"quantized": 0, "dequantized": 16}}
    ids = torch.randint(0, 512, (7,))
    torch.testing.assert_close(_logits(loaded.model, ids), _logits(ref.model, ids), rtol=0.05, atol=0.05)  # bf16-level (int4 path)
    # no Q4 layer: native on the CPU is the dequantized model, not an error
    assert load_model(str(write_synth_gguf(tmp_path / "q6.gguf", "tiny-llama", "q6_k")), device="cpu", progress=False,
                      weights="native").weight_plan["Q6_K"]["quantized"] == 0


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_codes_from_blocks_equal_gguf(fmt):
    """The codes, scales and zeros read from the blocks rebuild gguf's dequantized values; with a
    value-head gather (qwen35 ssm_out) in whole groups of 32 the columns follow."""
    from treeflash.models.int4_linear import GROUP, Int4Linear, codes_from_blocks, int4_codes

    qtype = getattr(T, fmt)
    lin, w = _layer(qtype, n=16, k=512)
    q, scale, zero = codes_from_blocks(lin.blocks, fmt, 512)
    rebuilt = (q - 8).float() * scale.repeat_interleave(GROUP, 1) + zero.repeat_interleave(GROUP, 1)
    torch.testing.assert_close(rebuilt, w, rtol=1e-6, atol=1e-7)
    perm = torch.randperm(4).repeat_interleave(128) * 128 + torch.arange(128).repeat(4)  # 4 heads of 128 reordered
    gathered = QuantLinear(lin.blocks, fmt, 512, in_index=torch.argsort(perm))
    x = torch.randn(3, 512)
    y = Int4Linear(*int4_codes(gathered))(x)
    ref = F.linear(x, w[:, perm])
    assert (y - ref).abs().max() <= 2e-2 * ref.abs().max()  # the kernel's bf16
    assert int4_codes(QuantLinear(lin.blocks, fmt, 512, in_index=torch.randperm(512))) is None  # splits groups


def test_type_without_any_reader_names_tensor_and_type(tmp_path):
    """A file declaring Q8_K (no kernel, no dequantizer in gguf-py) for one matrix: refused at open."""
    path = write_synth_gguf(tmp_path / "ok.gguf", "tiny-dense", "q8_0")
    from treeflash.models.gguf_loader import read_gguf

    reader = read_gguf(path)
    bad = tmp_path / "q8k.gguf"
    w = GGUFWriter(str(bad), "qwen3")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in reader.tensors:
        if t.name == "blk.1.ffn_up.weight":  # [512, 256] -> Q8_K: 292 bytes per 256 values
            w.add_tensor(t.name, np.zeros((512, 292), dtype=np.uint8), raw_dtype=T.Q8_K)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"q8k\.gguf: tensor blk\.1\.ffn_up\.weight has type Q8_K"):
        load_model(str(bad), device="cpu", progress=False)


def test_default_model_real_blocks_equal_dequantized():
    """SmolLM2's real Q4_1 blocks (llama q/k rows permuted as blocks) through the reference path:
    the dequantized model's logits. Skips when the default model is not in the cache (no download here)."""
    from treeflash.models.default_model import FILE_NAME, cache_dir

    path = cache_dir() / FILE_NAME
    if not path.is_file():
        pytest.skip(f"{path} not fetched")
    ckpt = open_checkpoint(path)
    ref = build_model(ckpt, torch.device("cpu"), torch.float32, progress=False)
    blocks = build_model(ckpt, torch.device("cpu"), torch.float32, progress=False, keep_quantized=lambda fmt: True)
    assert {m.fmt for m in blocks.modules() if isinstance(m, QuantLinear)} == {"Q4_1"}  # Q8_0: the tied embedding, read as a table
    ids = torch.tensor([1, 504, 3458, 314, 260, 3575, 282, 4649, 47])
    a, b = _logits(ref, ids), _logits(blocks, ids)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    assert torch.equal(a.argmax(-1), b.argmax(-1))
