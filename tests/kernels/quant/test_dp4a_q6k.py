"""dp4a_q6k (Q6_K at M == 1, x rounded to 8 bits per group of 32, integer dots, blocks read in word-aligned
pairs) against its plain-torch contract under TRITON_INTERPRET=1 (in a subprocess), on the same quantized
x, with and without a split over K; the fields rebuild gguf's weight; an odd block count falls back; and
the CUDA form (dp4a in inline PTX) compiles for sm_90 without spills."""

import pytest
import torch

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json, torch
from treeflash.kernels.quant import quant_matmul
from treeflash.kernels.quant.config import QuantTuning, Dp4aConfig
from treeflash.kernels.quant.dp4a_q4k import quantize_x
from treeflash.kernels.quant.dp4a_q6k import dp4a_q6k_ref
from treeflash.kernels.quant.reference import dequantize_ref
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(5)
out = {}
for N, K, dts, cfgs in ((20, 1024, (torch.float32, torch.bfloat16), ("split", "nosplit")), (8, 768, (torch.float32,), ("nosplit",))):
    blocks = random_blocks("Q6_K", N, K, g)  # K = 768: 3 blocks a row, the rows_q6k fallback
    w = dequantize_ref(blocks, "Q6_K", K)
    for dt in dts:
        x = (torch.randn(1, K, generator=g) * torch.rand(1, K, generator=g) * 4).to(dt)
        x[0, 32:64] = 0
        kq = quantize_x(x)
        ref = dp4a_q6k_ref(x, blocks, K, torch.float32, quantized=kq)
        exact = x.float() @ w.t()
        out[f"rounding_k{K}_{str(dt)[6:]}"] = ((ref - exact).abs().max() / exact.abs().max()).item()
        for name in cfgs if dt == torch.float32 else cfgs[-1:]:
            cfg = Dp4aConfig(block_n=16, min_programs=4) if name == "split" else Dp4aConfig(min_programs=1)
            for route in ("dp4a", "lanes"):
                y = quant_matmul(x, blocks, "Q6_K", K, out_dtype=torch.float32, tuning=QuantTuning(q6k_gemv_route=route, q6k_dp4a=cfg))
                target = ref if K == 1024 else exact  # odd block count: rows_q6k (exact codes, fp32 dot), not dp4a
                out[f"{route}_{name}_k{K}_{str(dt)[6:]}"] = ((y - target).abs().max() / target.abs().max()).item()
print(json.dumps(out))
"""


def test_dp4a_q6k_equals_its_contract_in_the_interpreter():
    res = run_interpreted(CHECK, timeout=600)
    runs = ["split_k1024_float32", "nosplit_k1024_float32", "nosplit_k1024_bfloat16"]
    assert sorted(res) == sorted(["rounding_k1024_float32", "rounding_k1024_bfloat16", "rounding_k768_float32"]
                                 + [f"{r}_{n}" for r in ("dp4a", "lanes") for n in runs + ["nosplit_k768_float32"]]), res
    for dt in ("float32", "bfloat16"):
        assert 1e-4 < res[f"rounding_k1024_{dt}"] < 2e-2, res  # 8-bit x: a real, small error against the exact product
    for route in ("dp4a", "lanes"):  # one row a thread, eight lanes a row
        for name in runs:
            assert res[f"{route}_{name}"] < 2e-6, (route, name, res)  # exact integer sums: only fp32 sums round
        assert res[f"{route}_nosplit_k768_float32"] < 1e-5, res  # the fallback, rows_q6k: exact codes and fp32 x


def test_the_fields_rebuild_the_weight():
    from treeflash.kernels.quant.dp4a_q6k import q6k_fields
    from treeflash.kernels.quant.reference import dequantize_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    blocks = random_blocks("Q6_K", 6, 512, torch.Generator().manual_seed(2))
    d, sc, q = q6k_fields(blocks, 512)
    assert q.min() >= 0 and q.max() <= 63
    w = (d.repeat_interleave(16, dim=1)[..., None] * sc[..., None] * (q - 32)).reshape(6, 512)
    assert torch.equal(w.float(), dequantize_ref(blocks, "Q6_K", 512))


@pytest.mark.parametrize("kind", ["dp4a", "lanes"])
def test_dp4a_q6k_compiles_for_sm90_with_dp4a(kind, tmp_path):
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import dp4a_q6k
    from treeflash.kernels.quant.config import Dp4aConfig

    if kind == "lanes":  # 32 threads a row: a warp's load is one row's 128 contiguous bytes
        from treeflash.kernels.quant.config import QuantTuning

        fn, cfg = dp4a_q6k.q6k_lanes_kernel, QuantTuning().q6k_lanes
        sig = ("XQ", "XS4", "XD", "W", "Y", "P", "CNT", "N", "ROW_WORDS")
    else:
        fn, cfg = dp4a_q6k.q6k_dp4a_kernel, Dp4aConfig()
        sig = ("XQ", "XD", "W", "Y", "P", "CNT", "N", "ROW_WORDS")
    types = {"XQ": "*i32", "XS4": "*i32", "XD": "*fp32", "W": "*i32", "Y": "*bf16", "P": "*fp32", "CNT": "*i32"}
    cst = dict(PPS=34, BLOCK_N=cfg.block_n, SPLIT=1, ASM=True)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps))
    ptx = k.asm["ptx"]
    assert "dp4a.u32.s32" in ptx and (kind == "lanes" or "dp4a.s32.s32" in ptx)  # lanes: x's sums come from quantize_x
    if kind == "lanes":
        assert "threadsPerWarp = [1, 32]" in k.asm["ttgir"]
    regs, spills = test_compile.ptxas_spills(ptx, tmp_path)
    assert spills == 0, (regs, spills)
