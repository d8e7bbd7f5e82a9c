"""mmq_q4k (Q4_K at 2..64 rows, x rounded to 8 bits per group of 32 as the decode step rounds it, int8 tensor-core
dots per group, the scales after) through the Triton interpreter (tests/kernels/quant/mmq_checks.py): equal to its
plain-torch contract on the same quantized x at M = 2, 5, 16, 33, 64, with a split over K and without; batch
invariant (a row's result, bitwise, whatever M, the tile or its position); equal to the decode step's dp4a_q4k row
by row at the same split; the reference's weight is gguf's; and the CUDA form compiles for sm_90 to int8 wgmma
with the codes as the register A operand and no spills."""

import functools
import re

import pytest
import torch

from tests.kernels.interpret import run_module
from tests.kernels.quant.mmq_checks import case_names
from treeflash.kernels.quant.config import MmqConfig, QuantTuning

REL = 2e-6  # of max(|reference|): the integer sums are exact, the fp32 scaling in the reference's order


@functools.cache
def results() -> dict:
    return run_module("tests.kernels.quant.mmq_checks", "Q4_K", timeout=600)


@pytest.mark.parametrize("name", case_names("Q4_K"))
def test_mmq_q4k_equals_its_contract(name):
    r = results()[name]
    assert r["rel"] <= REL, r
    assert r["equal"], r  # the interpreter does not fuse multiply-adds: the reference's order, bit for bit
    assert r["split"] == (2 if name.startswith("split") else 1), r


def test_mmq_q4k_is_batch_invariant_and_equals_the_decode_step():
    r = results()
    assert r["invariant"] and r["invariant_rows"] >= 100, r
    assert r["decode"]["equal"], r["decode"]  # dp4a_q4k at M == 1, row by row
    assert r["route"] == {"equal": True, "dtype": "torch.bfloat16"}, r["route"]


def test_the_reference_weight_is_ggufs():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from treeflash.kernels.quant.mmq_q4k import q4k_weight_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    blocks = random_blocks("Q4_K", 8, 768, torch.Generator().manual_seed(4))
    want = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType.Q4_K)).float()
    assert torch.equal(q4k_weight_ref(blocks, 768), want)


def test_the_route_and_config_are_checked():
    assert QuantTuning().q4k_rows_route == "q4k" and QuantTuning(q4k_rows_route="mmq").q4k_mmq == MmqConfig()
    for bad, field in (({"block_m": 8}, "block_m"), ({"block_n": 48}, "block_n"), ({"num_stages": 0}, "num_stages"),
                       ({"min_programs": 0}, "min_programs"), ({"num_warps": 3}, "num_warps"),
                       ({"block_m": 128, "num_warps": 8}, "exceeds 16 warps")):
        with pytest.raises(ValueError, match=field):
            MmqConfig(**bad)


def compile_mmq_q4k(block_m: int, partial: bool, cfg: MmqConfig = MmqConfig()):
    """q4k_mmq_kernel at K = 5120 (BPS 20) for bf16 output, as a launch with torch tensors specializes it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import mmq_q4k

    fn = mmq_q4k.q4k_mmq_kernel
    sig = ("XQ", "XDS", "W", "B", "Y", "P", "M", "M_PAD", "N", "K", "ROW_WORDS")
    types = {"XQ": "*i8", "XDS": "*fp32", "W": "*i32", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=20, BLOCK_M=block_m, BLOCK_N=cfg.block_n, PARTIAL=partial, ASM=True)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("M_PAD", "N", "K", "ROW_WORDS")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=mmq_q4k.warps_for(block_m, cfg), num_stages=cfg.num_stages))


@pytest.mark.parametrize("block_m,partial", [(16, True), (32, False), (64, False)])
def test_mmq_q4k_compiles_for_sm90_to_int8_wgmma_without_spills(block_m, partial, tmp_path):
    """Per group one wgmma m64nBMk32 s32.s8.s8 (8 a block) with the unpacked codes as its register A operand (no
    local_alloc of a value: the code bytes and x come in by cp.async, x straight into the B operand's layout), one
    layout conversion (the epilogue's), the (dx, s) pairs as 16-byte loads, no int-to-float conversions, and no spills."""
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    kernel = compile_mmq_q4k(block_m, partial)
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    n = min(block_m, 32)  # a warpgroup's share of x's rows (mmq_q4k.warps_for)
    wgmma = re.findall(r"wgmma\.mma_async\.\S+", ptx)
    assert len(wgmma) >= 8 and set(wgmma) == {f"wgmma.mma_async.sync.aligned.m64n{n}k32.s32.s8.s8"}, set(wgmma)
    dots = re.findall(r"ttng\.warp_group_dot %.*", ttgir)
    assert dots and all(re.search(r": tensor<64x32xi8, #ttg\.dot_op<\{opIdx = 0", d) for d in dots), dots[:1]
    assert not re.search(r"ttg\.local_alloc %", ttgir)
    assert len(re.findall(r"ttg\.convert_layout", ttgir)) == 1
    # the code bytes: 16-byte copies (8 with two warpgroups, which share the 64 x 32 tile)
    assert re.search(r"cp\.async\.c[ga]\.shared\.global \[[^]]*\], \[[^]]*\], 0x%s" % ("10" if block_m <= 32 else "8"), ptx)
    assert len(re.findall(r"ld\.global\.v4\.b32", ptx)) >= 8 * (n // 8)  # (dx, s) of two rows a load
    assert not re.search(r"cvt\.rn\.f32\.s32", ptx)  # exact_float, not int-to-float conversions
    regs, spilled = test_compile.ptxas_spills(ptx, tmp_path)
    assert spilled == 0 and regs <= 255, (regs, spilled)
