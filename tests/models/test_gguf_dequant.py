"""GGUF dequantization reads every type llama.cpp's standard and Unsloth Dynamic mixes use, equal to
gguf-py's reference (`gguf.quants.dequantize`), and refuses a type nothing can decode."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from treeflash.models.gguf_dequant import can_dequantize, dequantize, dequantize_rows, nbytes
from treeflash.models.gguf_synth import random_blocks

QUANTIZABLE = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F16]  # gguf-py can quantize these
MIX_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
             T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_quantizable_types_match_reference(qtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block (scale 0)
    raw = quants.quantize(x, qtype)
    ref = quants.dequantize(raw, qtype)
    ours = dequantize(torch.from_numpy(raw.copy()).view(torch.uint8).reshape(-1), qtype, (8, 256))
    assert ours.dtype == torch.float32 and ours.shape == (8, 256)
    np.testing.assert_array_equal(ours.numpy(), ref.astype(np.float32))


@pytest.mark.parametrize("qtype", MIX_TYPES, ids=lambda t: t.name)
def test_every_mix_type_reads_finite_and_equal_to_reference(qtype):
    """Random blocks with sane scales (gguf_synth); chunked reads (a small max_chunk_elems) equal one read."""
    blocks = random_blocks(qtype, (6, 512), np.random.default_rng(1))  # [6, row bytes]
    ref = quants.dequantize(blocks, qtype)
    assert np.isfinite(ref).all() and 0 < np.abs(ref).max() < 1.0
    ours = dequantize_rows(torch.from_numpy(blocks), qtype, 512, max_chunk_elems=512)
    np.testing.assert_array_equal(ours.numpy(), ref)
    assert dequantize(torch.from_numpy(blocks.reshape(-1)), qtype, (6, 512), torch.bfloat16).dtype == torch.bfloat16


def test_f32_and_output_dtype():
    x = torch.randn(4, 8)
    raw = x.view(torch.uint8).reshape(-1)
    assert torch.equal(dequantize(raw, T.F32, (4, 8)), x)
    assert dequantize(raw, T.F32, (4, 8), torch.bfloat16).dtype == torch.bfloat16


def test_bad_sizes_and_types_raise():
    with pytest.raises(ValueError, match="bytes"):
        dequantize(torch.zeros(33, dtype=torch.uint8), T.Q8_0, (32,))
    with pytest.raises(ValueError, match="multiple"):
        nbytes(T.Q8_0, (2, 48))
    assert not can_dequantize(T.Q8_K) and not can_dequantize(T.I32) and not can_dequantize(999)
    with pytest.raises(ValueError, match="unsupported tensor type Q8_K"):
        dequantize(torch.zeros(292, dtype=torch.uint8), T.Q8_K, (256,))
