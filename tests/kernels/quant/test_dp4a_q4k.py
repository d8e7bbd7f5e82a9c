"""dp4a_q4k (Q4_K at M == 1 with x rounded to 8 bits per group of 32, integer dots) against its plain-torch
contract under TRITON_INTERPRET=1 (in a subprocess: the interpreter is chosen when triton loads): x's
quantization, the GEMV on the same quantized x, with and without a split over K and unrolling, fp32 and
bf16 x; the rounding's own error against the exact product; and the CUDA form (dp4a in inline PTX)
compiles for sm_90 without spills."""

import re

import pytest
import torch

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json, torch
from treeflash.kernels.quant import quant_matmul
from treeflash.kernels.quant.config import QuantTuning, Dp4aConfig
from treeflash.kernels.quant.dp4a_q4k import dp4a_q4k_ref, quantize_x, quantize_x_ref
from treeflash.kernels.quant.reference import dequantize_ref
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(3)
N, K = 100, 1024
blocks = random_blocks("Q4_K", N, K, g)
w = dequantize_ref(blocks, "Q4_K", K)
out = {}
for dt in (torch.float32, torch.bfloat16):
    x = (torch.randn(1, K, generator=g) * torch.rand(1, K, generator=g) * 4).to(dt)
    x[0, 64:96] = 0  # a group of zeros: amax == 0
    kq = quantize_x(x)
    rq = quantize_x_ref(x)
    out[f"quant_{str(dt)[6:]}"] = [(kq[0].int() - rq[0].int()).abs().max().item(), (kq[0] != rq[0]).sum().item(),
                                   (kq[1] - rq[1]).abs().max().item(), ((kq[2] - rq[2]).abs().max() / rq[2].abs().max()).item()]
    ref = dp4a_q4k_ref(x, blocks, K, torch.float32, quantized=kq)
    exact = x.float() @ w.t()
    out[f"rounding_{str(dt)[6:]}"] = ((ref - exact).abs().max() / exact.abs().max()).item()
    for name, cfg in (("split", Dp4aConfig()), ("nosplit_unroll1", Dp4aConfig(min_programs=1, unroll=1)),
                      ("bn16", Dp4aConfig(block_n=16, min_programs=8)),
                      ("prefetch", Dp4aConfig(prefetch=True, min_programs=4))):
        y = quant_matmul(x, blocks, "Q4_K", K, out_dtype=torch.float32, tuning=QuantTuning(q4k_gemv_route="dp4a", q4k_dp4a=cfg))
        out[f"{name}_{str(dt)[6:]}"] = ((y - ref).abs().max() / ref.abs().max()).item()
    for name, cfg in (("lanes_split", Dp4aConfig(block_n=16, min_programs=16)), ("lanes_nosplit", Dp4aConfig(block_n=32, min_programs=1))):
        y = quant_matmul(x, blocks, "Q4_K", K, out_dtype=torch.float32, tuning=QuantTuning(q4k_gemv_route="lanes", q4k_lanes=cfg))
        out[f"{name}_{str(dt)[6:]}"] = ((y - ref).abs().max() / ref.abs().max()).item()
print(json.dumps(out))
"""


def test_dp4a_q4k_equals_its_contract_in_the_interpreter():
    res = run_interpreted(CHECK, timeout=600)
    assert len(res) == 16, res
    for dt in ("float32", "bfloat16"):
        step, flips, ddx, ds = res[f"quant_{dt}"]
        assert step <= 1 and flips <= 2 and ddx == 0 and ds < 1e-6, res  # only ties x 127 / amax = j + 1/2 may differ
        assert 1e-4 < res[f"rounding_{dt}"] < 2e-2, res  # 8-bit x: a real, small error against the exact product
        for name in ("split", "nosplit_unroll1", "bn16", "prefetch", "lanes_split", "lanes_nosplit"):
            assert res[f"{name}_{dt}"] < 2e-6, (name, dt, res)  # the integer sums are exact: only fp32 sums round


def test_the_reference_rebuilds_the_weight_and_rounds_like_llama_cpp():
    from treeflash.kernels.quant.dp4a_q4k import q4k_fields, quantize_x_ref
    from treeflash.kernels.quant.reference import dequantize_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    g = torch.Generator().manual_seed(1)
    blocks = random_blocks("Q4_K", 8, 512, g)
    d, dsc, dmn, q = q4k_fields(blocks, 512)
    w = dequantize_ref(blocks, "Q4_K", 512).double().reshape(8, 16, 32)
    assert torch.equal((dsc[..., None] * q - dmn[..., None]).float(), w.float())
    x = torch.tensor([[1.0, -2.0, 0.5, 127.0] * 8, [0.0] * 32])
    xq, dx, s = quantize_x_ref(x)
    assert xq[0, :4].tolist() == [1, -2, 1, 127] and xq[1].abs().sum() == 0 and dx[1, 0] == 0  # 0.5 rounds up
    assert dx[0, 0] == 1.0 and s[0, 0] == 8 * 126.5


@pytest.mark.parametrize("kind", ["dp4a", "prefetch", "lanes", "lanes_fused_split"])
def test_dp4a_q4k_compiles_for_sm90_with_dp4a(kind, tmp_path):
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import dp4a_q4k
    from treeflash.kernels.quant.config import Dp4aConfig, QuantTuning

    sig = ("XQ", "XD", "XS", "W", "Y", "P", "CNT", "N", "ROW_WORDS")
    types = {"XQ": "*i32", "XD": "*fp32", "XS": "*fp32", "W": "*i32", "Y": "*bf16", "P": "*fp32", "CNT": "*i32"}
    if kind.startswith("lanes"):
        fn, cfg = dp4a_q4k.q4k_lanes_kernel, QuantTuning().q4k_lanes
        cst = dict(BPS=20, BLOCK_N=cfg.block_n, SPLIT=4 if "fused" in kind else 1, ASM=True, FUSED=True)
    else:
        fn, cfg = dp4a_q4k.q4k_dp4a_kernel, Dp4aConfig()
        cst = dict(BPS=20, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, PREFETCH=kind == "prefetch", SPLIT=1, ASM=True)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a == "ROW_WORDS"}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps))
    ptx = k.asm["ptx"]
    assert "dp4a.u32.s32" in ptx
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx  # the code words as 16-byte vectors
    if "fused" in kind:  # split_k.finish_split: every thread fences, one ticket a program
        assert "fence.acq_rel.gpu" in ptx and re.search(r"atom\.global\.gpu\.acq_rel\.add", ptx), ptx[-3000:]
    if kind.startswith("lanes"):  # eight threads a row: a warp's load is four rows x 128 contiguous bytes
        assert re.search(r"sizePerThread = \[1, 4\], threadsPerWarp = \[4, 8\]", k.asm["ttgir"])
    regs, spills = test_compile.ptxas_spills(ptx, tmp_path)
    assert spills == 0, (regs, spills)
    (tmp_path / "dp4a.ptx").write_text(ptx)
