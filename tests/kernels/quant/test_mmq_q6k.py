"""mmq_q6k (Q6_K at 2..64 rows, x rounded to 8 bits per group of 32, two int8 tensor-core dots per group of 32: one
per scale) through the Triton interpreter (tests/kernels/quant/mmq_checks.py): equal to its plain-torch contract on
the same quantized x, with a split over K and without; batch invariant; equal to the decode step's dp4a_q6k row by
row at the same split; the reference's weight is gguf's; and the CUDA form compiles for sm_90 to int8 wgmma."""

import functools
import re

import pytest
import torch

from tests.kernels.interpret import run_module
from tests.kernels.quant.mmq_checks import case_names

REL = 2e-6  # of max(|reference|): the integer sums are exact, the fp32 scaling in the reference's order


@functools.cache
def results() -> dict:
    return run_module("tests.kernels.quant.mmq_checks", "Q6_K", timeout=600)


@pytest.mark.parametrize("name", case_names("Q6_K"))
def test_mmq_q6k_equals_its_contract(name):
    r = results()[name]
    assert r["rel"] <= REL and r["equal"], r
    assert r["split"] == (2 if name.startswith("split") else 1), r


def test_mmq_q6k_is_batch_invariant_and_equals_the_decode_step():
    r = results()
    assert r["invariant"] and r["invariant_rows"] >= 6, r
    assert r["decode"]["equal"], r["decode"]  # dp4a_q6k at M == 1, row by row
    assert r["route"] == {"equal": True, "dtype": "torch.bfloat16"}, r["route"]


def test_the_reference_weight_is_ggufs():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from treeflash.kernels.quant.mmq_q6k import q6k_weight_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    blocks = random_blocks("Q6_K", 8, 768, torch.Generator().manual_seed(4))
    want = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType.Q6_K)).float()
    assert torch.equal(q6k_weight_ref(blocks, 768), want)


@pytest.mark.parametrize("block_m", [16, 32, 64])
def test_mmq_q6k_compiles_for_sm90_to_int8_wgmma(block_m, tmp_path):
    """Two wgmma m64nBMk32 s32.s8.s8 per group of 32 (16 a block). The code bytes (2-byte aligned rows) load into
    registers and pass through shared memory to the A operand, as in rows_q6k; at BLOCK_M 32 and 64 ptxas spills
    (a known limit, bounded here: 64-224 bytes on triton 3.6), at 16 it does not."""
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import mmq_q4k, mmq_q6k
    from treeflash.kernels.quant.config import MmqConfig

    cfg, fn = MmqConfig(), mmq_q6k.q6k_mmq_kernel
    sig = ("XQ", "XDS", "H", "B", "Y", "P", "M", "M_PAD", "N", "K", "ROW_HALVES")
    types = {"XQ": "*i8", "XDS": "*fp32", "H": "*i16", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=20, BLOCK_M=block_m, BLOCK_N=cfg.block_n, PARTIAL=False, ASM=True)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("M_PAD", "N", "K")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=mmq_q4k.warps_for(block_m, cfg), num_stages=cfg.num_stages))
    wgmma = re.findall(r"wgmma\.mma_async\.\S+", k.asm["ptx"])
    assert len(wgmma) >= 16 and set(wgmma) == {f"wgmma.mma_async.sync.aligned.m64n{min(block_m, 32)}k32.s32.s8.s8"}, set(wgmma)
    regs, spilled = test_compile.ptxas_spills(k.asm["ptx"], tmp_path)
    assert regs <= 255 and (spilled == 0 if block_m == 16 else spilled <= 512), (regs, spilled)
