"""quantize_q8_0 equals gguf's Q8_0 quantizer bit for bit (scales and codes), ties and zero blocks included."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from treeflash.kernels.quant import dequantize_ref
from treeflash.kernels.quant.quantize import quantize_q8_0


def _gguf(w: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(quants.quantize(w.float().numpy(), GGMLQuantizationType.Q8_0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_gguf(dtype):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(67, 96, generator=g) * 0.02).to(dtype)
    w[3] = 0  # zero blocks: d = 0, id = 0
    w[5, :32] = torch.arange(32) - 15.5  # x * id lands on halves: rounded away from zero
    w[6, :32] = 127.0 / torch.arange(1, 33)
    assert torch.equal(quantize_q8_0(w, max_rows=16), _gguf(w))


def test_round_trip_is_close():
    w = torch.randn(8, 64)
    back = dequantize_ref(quantize_q8_0(w), "Q8_0", 64)
    assert (back - w).abs().max() <= w.abs().max() / 127


def test_bad_shape_raises():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(torch.zeros(2, 33))
