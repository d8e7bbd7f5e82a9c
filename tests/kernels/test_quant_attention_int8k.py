"""int8 q.k over a q8_0 K cache (LaunchConfig.k_int8; the int8k_* launch variants): the query is
quantized per 32 values to int8, K's raw codes go into tl.dot(int8, int8) -> int32 per block, and
both scales are applied to each block's partial scores.

The kernel is checked under TRITON_INTERPRET=1 (interpret_checks' "attention_int8k" group: decode at
Qwen3.5-27B's GQA shape, head_dim 256 and 128, tree verify, the static masked entry point) against
quant_attention_int8k_reference (tight) and dequantize + SDPA (INT8K_REL_TOL); the plain-torch
reference is checked here against dequantize + SDPA directly."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import assert_check
from tests.kernels.interpret_checks import INT8K_REL_TOL, _planes, _tree_mask, groups

pytest.importorskip("triton")
NAMES = list(groups()["attention_int8k"])
TREE = [-1, 0, 0, 1, 2, 2, 4]


@pytest.mark.parametrize("name", NAMES)
def test_int8k_kernel(name):
    assert_check("attention_int8k", name)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def test_int8_query_reference_quantizes_per_block():
    from treeflash.kernels.quant_attention_int8k import int8_query_reference

    torch.manual_seed(0)
    q = torch.randn(3, 5, 128) * 3
    q[0, 0, :32] = 0  # an all-zero block: scale 0, codes 0
    codes, scales = int8_query_reference(q)
    assert codes.dtype == torch.int8 and codes.shape == (3, 5, 4, 32) and scales.dtype == torch.float32
    assert scales[0, 0, 0] == 0 and (codes[0, 0, 0] == 0).all()
    assert codes.abs().max() <= 127 and (codes.abs().amax(-1)[scales > 0] == 127).all()
    err = (codes.float() * scales[..., None] - q.unflatten(-1, (4, 32))).abs()
    assert (err <= scales[..., None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("head_dim", [256, 128])
def test_int8k_reference_is_exact_for_a_representable_query(head_dim):
    """A query whose blocks are already int8 codes times a scale (one code at 127) loses nothing:
    the int8 reference then equals dequantize + SDPA up to rounding."""
    from treeflash.kernels.quant_attention import quant_attention_reference
    from treeflash.kernels.quant_attention_int8k import quant_attention_int8k_reference

    torch.manual_seed(1)
    nb = head_dim // 32
    codes = torch.randint(-127, 128, (len(TREE), 24, nb, 32)).float()
    codes[..., 0] = 127
    q = (codes * (torch.rand(len(TREE), 24, nb, 1) * 0.05 + 0.01)).flatten(-2)
    k = _planes("q8_0", torch.randn(90, 4, head_dim))
    v = _planes("q4_0", torch.randn(90, 4, head_dim))
    out = quant_attention_int8k_reference(q, k, v, 90 - len(TREE), _tree_mask(TREE), head_dim**-0.5)
    ref = quant_attention_reference(q, k, v, 90 - len(TREE), _tree_mask(TREE), head_dim**-0.5)
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("head_dim", [256, 128])
@pytest.mark.parametrize("num_new", [1, len(TREE)])
def test_int8k_reference_stays_close_to_dequantize_sdpa(head_dim, num_new):
    """The query's quantization is the only difference: at 2,000 keys of random data, max |error| /
    max |output| was 0.6-0.8e-2 (head_dim 256 and 128); the bound is INT8K_REL_TOL (2e-2, the GPU
    sweep's tolerance)."""
    from treeflash.kernels.quant_attention import quant_attention_reference
    from treeflash.kernels.quant_attention_int8k import quant_attention_int8k_reference

    torch.manual_seed(2)
    length = 2000
    k = _planes("q8_0", torch.randn(length, 4, head_dim))
    v = _planes("q8_0", torch.randn(length, 4, head_dim))
    q = torch.randn(num_new, 24, head_dim)
    mask = None if num_new == 1 else _tree_mask(TREE)
    out = quant_attention_int8k_reference(q, k, v, length - num_new, mask, head_dim**-0.5)
    ref = quant_attention_reference(q, k, v, length - num_new, mask, head_dim**-0.5)
    assert 1e-4 < _rel(out, ref) < INT8K_REL_TOL


def test_int8k_reference_needs_q8_0_keys():
    from treeflash.kernels.quant_attention_int8k import quant_attention_int8k_reference

    k = _planes("q4_0", torch.randn(10, 2, 64))
    with pytest.raises(ValueError, match="q8_0"):
        quant_attention_int8k_reference(torch.randn(1, 4, 64), k, k, 9, None, 0.125)


def test_k_int8_is_opt_in():
    """No default launch configuration uses int8 q.k; the int8k_* variants do."""
    from treeflash.kernels.attention_launch import VARIANTS, launch_config, variant_config

    for head_dim in (64, 128, 256):
        for rows in (1, 6, 96):
            for dense, compressed in ((False, False), (True, False), (False, True)):
                assert not launch_config(head_dim, rows, dense_kv=dense, compressed_kv=compressed).k_int8
    int8k = [name for name, fields in VARIANTS.items() if fields.get("k_int8")]
    assert int8k and all(name.startswith("int8k") for name in int8k)
    assert all(variant_config(name, 256, 6).k_int8 for name in int8k)
