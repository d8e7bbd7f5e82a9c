"""dequantize_ref (kernels/quant/reference.py) equals gguf.quants.dequantize bit for bit: on random
blocks with sane scales for every format, and on real blocks of the offline GGUFs where present."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from treeflash.kernels.quant import FORMATS, BlockFormatError, dequantize_ref, get_format, has_kernel, quant_matmul
from treeflash.kernels.quant.synthetic import random_blocks
from treeflash.models.default_model import FILE_NAME, cache_dir

# the offline GGUFs (bench/spec_pair_cpu.py fetch_gguf puts the pairs there) and the formats they hold
REAL_FILES = {
    "default": (FILE_NAME, ("Q4_1", "Q8_0")),
    "qwen2.5-coder-0.5b": ("pairs/qwen2.5-coder-0.5b-instruct.gguf", ("Q5_0", "Q8_0", "Q4_K", "Q6_K")),
    "qwen2.5-coder-1.5b": ("pairs/qwen2.5-coder-1.5b-instruct.gguf", ("Q4_K", "Q6_K")),
}
ROWS_PER_TENSOR = 48  # a sample of each tensor's rows: first, last and strided (the whole file takes minutes)


def assert_bit_identical(got: torch.Tensor, ref: np.ndarray, what: str) -> None:
    assert got.dtype == torch.float32 and tuple(got.shape) == ref.shape, what
    assert np.isfinite(ref).all(), what
    same = got.numpy().view(np.uint32) == ref.astype(np.float32).view(np.uint32)
    assert same.all(), f"{what}: {int((~same).sum())} of {same.size} values differ"


def test_formats_are_ggmls():
    for name, f in FORMATS.items():
        t = gguf.GGMLQuantizationType[name]
        assert f.ggml_type == int(t) and (f.block_values, f.block_bytes) == gguf.GGML_QUANT_SIZES[t], name


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_blocks_match_gguf(fmt):
    f = FORMATS[fmt]
    for n, k in [(3, 256), (5, 1024)]:
        blocks = random_blocks(fmt, n, k, torch.Generator().manual_seed(n * 7 + k))
        ref = dequantize(blocks.numpy(), gguf.GGMLQuantizationType[fmt])
        assert ref.shape == (n, k)
        w = dequantize_ref(blocks, fmt, k)
        assert_bit_identical(w, ref, f"{fmt} n={n} k={k}")
        assert w.abs().max() > 0 and w.abs().max() < 4  # sane scales: finite, realistic weights
    assert f.row_bytes(512) == 512 // f.block_values * f.block_bytes


def _sample_rows(n: int) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(min(n, 8)), np.linspace(0, n - 1, ROWS_PER_TENSOR).astype(int)]))


@pytest.mark.parametrize("model", list(REAL_FILES))
def test_real_blocks_match_gguf(model):
    rel, formats = REAL_FILES[model]
    path = cache_dir() / rel
    if not path.is_file():
        pytest.skip(f"{path} is absent (bench/spec_pair_cpu.py fetch_gguf fetches the pairs)")
    reader = gguf.GGUFReader(path)
    checked = {fmt: 0 for fmt in formats}
    for t in reader.tensors:
        fmt = t.tensor_type.name
        if fmt not in checked or checked[fmt] >= 4:
            continue
        k = int(t.shape[0])  # gguf lists dims innermost first: shape[0] is a row's length
        data = np.asarray(t.data).reshape(-1, get_format(fmt).row_bytes(k))
        rows = data[_sample_rows(data.shape[0])]
        ref = dequantize(rows, t.tensor_type)
        assert_bit_identical(dequantize_ref(torch.from_numpy(rows.copy()), fmt, k), ref, f"{model} {t.name} {fmt}")
        checked[fmt] += 1
    assert all(checked.values()), f"{model}: no tensor of {[f for f, c in checked.items() if not c]} in {path}"


def test_unknown_format_is_named():
    blocks = torch.zeros(2, 18, dtype=torch.uint8)
    for call in (lambda: dequantize_ref(blocks, "Q4_9", 32), lambda: has_kernel("Q4_9"),
                 lambda: quant_matmul(torch.zeros(1, 32), blocks, "Q4_9", 32)):
        with pytest.raises(BlockFormatError, match="Q4_9"):
            call()


def test_bad_shapes_are_refused():
    with pytest.raises(BlockFormatError, match="multiple of 256"):
        dequantize_ref(torch.zeros(2, 144, dtype=torch.uint8), "Q4_K", 300)
    with pytest.raises(BlockFormatError, match=r"\[N, 144\]"):
        dequantize_ref(torch.zeros(2, 140, dtype=torch.uint8), "Q4_K", 256)
    with pytest.raises(BlockFormatError, match=r"x must be \[M, 256\]"):
        quant_matmul(torch.zeros(1, 128), torch.zeros(2, 144, dtype=torch.uint8), "Q4_K", 256)


@pytest.mark.parametrize("fmt", ["Q4_K", "Q8_0"])
def test_cpu_matmul_is_the_reference(fmt):
    """Off CUDA quant_matmul is dequantize_ref + an fp32 matmul, rounded once to out_dtype."""
    blocks = random_blocks(fmt, 24, 512, torch.Generator().manual_seed(1))
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = quant_matmul(x, blocks, fmt, 512)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 24)
    assert torch.equal(y, (x.float() @ dequantize_ref(blocks, fmt, 512).t()).to(torch.bfloat16))
    assert quant_matmul(x, blocks, fmt, 512, out_dtype=torch.float32).dtype == torch.float32
