"""rows_q6k (kernels/quant/rows_q6k.py), the small-M Q6_K kernel: through the Triton interpreter equal to its
contract rows_q6k_ref (dequantize_ref rounded to x's dtype, an fp32 matmul) within fp32 accumulation error,
and to x @ dequantize_ref^T within that rounding's bound, at M = 1, 2, 5, 33 on N = 100 (a ragged tail of
BLOCK_N), with the split over K and without, bitwise repeatable. And compiled for sm_90: wgmma, no spills."""

import functools
import re

import pytest

from tests.kernels.interpret import run_module
from tests.kernels.quant.rows_q6k_checks import case_names
from tests.kernels.quant.test_compile import K, needs_ptxas, ptxas_spills

FP32_REL = 2e-6  # of max(|reference|), as test_rows_q4k.py: K = 1024 fp32 products in another order


@functools.cache
def results() -> dict:
    return run_module("tests.kernels.quant.rows_q6k_checks", timeout=600)


@pytest.mark.parametrize("name", case_names())
def test_rows_q6k_matches_its_references(name):
    r = results()[name]
    assert r["contract"] <= FP32_REL * r["scale"], r
    assert r["excess"] <= FP32_REL * r["scale"], r
    assert r["same"], r
    assert r["split"] == (1 if "nosplit" in name else 4), r  # N = 100: 2 programs, so a split of 4 over the 4 blocks


def compile_q6k_rows(block_m: int, partial: bool):
    """rows_q6k's kernel at the default configuration for bf16 x at K = 5120 (BPS 20), as a launch with torch
    tensors specializes it (ROW_HALVES = 20 * 105 is not a multiple of 16, so it gets no divisibility)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import rows_q6k
    from treeflash.kernels.quant.config import Q4kRowsConfig

    cfg = Q4kRowsConfig()
    fn = rows_q6k.q6k_rows_kernel
    sig = ("X", "H", "B", "Y", "P", "M", "N", "K", "ROW_HALVES")
    types = {"X": "*bf16", "H": "*i16", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=K // 256, BLOCK_M=block_m, BLOCK_N=cfg.block_n, PARTIAL=partial, ROUND_W=True, DOT_F32=False)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("N", "K")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


@needs_ptxas
@pytest.mark.parametrize("block_m,partial", [(16, True), (64, False)])
def test_rows_q6k_compiles_to_wgmma_without_spills(block_m, partial, tmp_path):
    """The default configuration at the smallest and largest BLOCK_M: the four K = 64 dots a block lower to wgmma
    with the dequantized weight as the register A operand; ptxas needs no spills."""
    kernel = compile_q6k_rows(block_m, partial)
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    dots = re.findall(r"ttng\.warp_group_dot %.*", ttgir)
    assert len(dots) == 4 and all(re.search(r": tensor<64x64xbf16, #ttg\.dot_op<\{opIdx = 0", d) for d in dots), dots
    assert len(re.findall(r"wgmma\.mma_async", ptx)) >= 16  # 4 dots of K = 64 a block, k16 each
    regs, spilled = ptxas_spills(ptx, tmp_path)
    assert spilled == 0 and regs <= 255, (regs, spilled)
