"""dp4a_q8_0 (Q8_0 at M == 1, x rounded to 8 bits per group of 32, integer dots, blocks read in word-aligned
pairs) against its plain-torch contract under TRITON_INTERPRET=1 (in a subprocess), on the same quantized x,
with and without a split over K; an odd block count falls back to the generic GEMV; and the CUDA form (dp4a
in inline PTX) compiles for sm_90 without spills."""

import pytest

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json, torch
from treeflash.kernels.quant import quant_matmul
from treeflash.kernels.quant.config import QuantTuning, Dp4aConfig
from treeflash.kernels.quant.dp4a_q4k import quantize_x
from treeflash.kernels.quant.dp4a_q8_0 import dp4a_q8_0_ref
from treeflash.kernels.quant.reference import dequantize_ref
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(7)
out = {}
for N, K in ((96, 512), (10, 96)):  # 16 blocks a row; 3 blocks: the generic GEMV
    blocks = random_blocks("Q8_0", N, K, g)
    w = dequantize_ref(blocks, "Q8_0", K)
    for dt in (torch.float32, torch.bfloat16):
        x = (torch.randn(1, K, generator=g) * torch.rand(1, K, generator=g) * 4).to(dt)
        x[0, 32:64] = 0
        kq = quantize_x(x)
        ref = dp4a_q8_0_ref(x, blocks, K, torch.float32, quantized=kq)
        exact = x.float() @ w.t()
        out[f"rounding_k{K}_{str(dt)[6:]}"] = ((ref - exact).abs().max() / exact.abs().max()).item()
        for name, cfg in (("split", Dp4aConfig()), ("nosplit", Dp4aConfig(block_n=32, min_programs=1))):
            y = quant_matmul(x, blocks, "Q8_0", K, out_dtype=torch.float32, tuning=QuantTuning(q8_0_dp4a=cfg))
            target = ref if K == 512 else exact
            out[f"{name}_k{K}_{str(dt)[6:]}"] = ((y - target).abs().max() / target.abs().max()).item()
print(json.dumps(out))
"""


def test_dp4a_q8_0_equals_its_contract_in_the_interpreter():
    res = run_interpreted(CHECK, timeout=600)
    assert len(res) == 12, res
    for dt in ("float32", "bfloat16"):
        assert 1e-4 < res[f"rounding_k512_{dt}"] < 2e-2, res  # 8-bit x: a real, small error against the exact product
        for name in ("split", "nosplit"):
            assert res[f"{name}_k512_{dt}"] < 2e-6, (name, dt, res)  # exact integer sums: only fp32 sums round
            assert res[f"{name}_k96_{dt}"] < 1e-5, (name, dt, res)  # the generic GEMV: exact in fp32


def test_dp4a_q8_0_compiles_for_sm90_with_dp4a(tmp_path):
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import dp4a_q8_0
    from treeflash.kernels.quant.config import QuantTuning

    fn, cfg = dp4a_q8_0.q8_0_dp4a_kernel, QuantTuning().q8_0_dp4a
    sig = ("XQ", "XD", "W", "Y", "P", "CNT", "N", "ROW_WORDS")
    types = {"XQ": "*i32", "XD": "*fp32", "W": "*i32", "Y": "*bf16", "P": "*fp32", "CNT": "*i32"}
    cst = dict(PPS=2, BLOCK_N=cfg.block_n, SPLIT=4, ASM=True)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps))
    assert "dp4a.s32.s32" in k.asm["ptx"]
    regs, spills = test_compile.ptxas_spills(k.asm["ptx"], tmp_path)
    assert spills == 0, (regs, spills)
