"""rows_gemm's kernel compiles for an H100/H200 (sm_90) on this CPU-only machine (triton.compile down to the bundled
ptxas, as tests/kernels/quant/test_compile.py): bf16 x at the configs rows_gemm_config gives two model shapes, with
the split (fp32 partials) and without (the bias + residual epilogue): the swapped dot lowers to wgmma (64 weight rows
x 16 rows of x, K 16 an instruction) and ptxas reports no spills."""

import re

import pytest
import triton

from tests.kernels.quant.test_compile import ASTSource, GPUTarget, needs_ptxas, ptxas_spills
from treeflash.kernels.linear.rows_gemm import BLOCK_M, rows_gemm_config


def compile_rows_gemm(n: int, k: int, partial: bool, epilogue: bool):
    """The kernel for bf16 x [M, K] @ w [N, K]^T as a launch with torch tensors and K, N divisible by 16 specializes it."""
    from treeflash.kernels.linear import rows_gemm

    cfg = rows_gemm_config(n, k)
    tiles = triton.cdiv(triton.cdiv(k, cfg.split), cfg.block_k)
    fn = rows_gemm._rows_gemm_kernel
    sig = ("X", "W", "B", "R", "Y", "P", "M", "N", "K")
    types = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "R": "*bf16", "Y": "*bf16", "P": "*fp32"}
    cst = dict(TILES=tiles, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_M=BLOCK_M, EVEN_K=True, PARTIAL=partial,
               HAS_BIAS=epilogue, ADD=epilogue, DOT_F32=False)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("N", "K")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return cfg, triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


@needs_ptxas
@pytest.mark.parametrize("n,k,partial,epilogue", [(5120, 6144, True, False), (14336, 5120, False, True),
                                                  (24576, 4096, False, False)])
def test_rows_gemm_compiles_to_wgmma_without_spills(n, k, partial, epilogue, tmp_path):
    cfg, kernel = compile_rows_gemm(n, k, partial, epilogue)
    assert (cfg.split > 1) == partial  # the shape's own config takes the path under test
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    assert re.search(r"ttng\.warp_group_dot", ttgir), "the dot is not a wgmma"
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.bf16\.bf16", ptx)
    assert re.search(r"cp\.async", ptx), "the tiles are not copied asynchronously (no pipelining)"
    regs, spilled = ptxas_spills(ptx, tmp_path)
    assert spilled == 0 and regs <= 255, (regs, spilled)
