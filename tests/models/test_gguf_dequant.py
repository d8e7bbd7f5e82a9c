"""Our GGUF dequantization equals gguf-py's reference (`gguf.quants.dequantize`) on every type we read."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from treeflash.models.gguf_dequant import BLOCK_LAYOUT, dequantize, nbytes

QUANTIZABLE = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F16]  # gguf-py can quantize these
K_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]  # reference dequantizes only: random blocks with sane scales


def _random_k_blocks(qtype, n_blocks: int, rng) -> np.ndarray:
    """Random bytes, with every fp16 scale field overwritten by a finite value."""
    _, size = BLOCK_LAYOUT[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, size=(n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == T.Q6_K:
        blocks[:, 208:210] = scales[:, :2]  # d last
    else:
        blocks[:, 0:4] = scales  # d, dmin first
    return blocks


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


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_k_types_match_reference(qtype):
    rng = np.random.default_rng(1)
    blocks = _random_k_blocks(qtype, 6, rng)
    ref = quants.dequantize(blocks.reshape(3, -1), qtype)  # [3, 512]
    ours = dequantize(torch.from_numpy(blocks.reshape(-1)), qtype, (3, 512))
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-6, atol=1e-6)


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
    with pytest.raises(ValueError, match="unsupported"):
        dequantize(torch.zeros(66, dtype=torch.uint8), T.Q2_K, (256,))
