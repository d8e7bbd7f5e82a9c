"""dp4a_q3k (Q3_K at M == 1, x rounded to 8 bits per group of 32, integer dots, blocks read in word-aligned
pairs) against its plain-torch contract under TRITON_INTERPRET=1 (in a subprocess: the interpreter is chosen
when triton loads): the kernel through its wrapper on the same quantized x, with and without a split over K,
unrolled or not, 16 or 64 rows a program, fp32 and bf16 x; the rounding's own error against the exact
product; the fields rebuild gguf's weight; an odd block count is refused; and the CUDA form (dp4a and dp2a in
inline PTX) compiles for sm_90 without spills."""

import pytest
import torch

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json, torch
from treeflash.kernels.quant.config import Dp4aConfig
from treeflash.kernels.quant.dp4a_q4k import quantize_x
from treeflash.kernels.quant.dp4a_q3k import dp4a_q3k, dp4a_q3k_ref
from treeflash.kernels.quant.reference import dequantize_ref
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(3)
out = {}
cases = (  # (N, K, dtype, configs): 4 blocks a row (two pairs), and 6 (three pairs: unroll 2 falls back to 1)
    (100, 1024, torch.float32, (("split", Dp4aConfig()), ("nosplit_unroll1", Dp4aConfig(min_programs=1, unroll=1)),
                                ("bn16", Dp4aConfig(block_n=16, min_programs=1)))),
    (100, 1024, torch.bfloat16, (("split", Dp4aConfig()), ("nosplit", Dp4aConfig(min_programs=1)))),
    (40, 1536, torch.float32, (("split3", Dp4aConfig()),)),
)
for N, K, dt, cfgs in cases:
    blocks = random_blocks("Q3_K", N, K, g)
    w = dequantize_ref(blocks, "Q3_K", K)
    x = (torch.randn(1, K, generator=g) * torch.rand(1, K, generator=g) * 4).to(dt)
    x[0, 64:96] = 0  # a group of zeros: amax == 0
    kq = quantize_x(x)
    ref = dp4a_q3k_ref(x, blocks, K, torch.float32, quantized=kq)
    exact = x.float() @ w.t()
    tag = f"k{K}_{str(dt)[6:]}"
    out[f"rounding_{tag}"] = ((ref - exact).abs().max() / exact.abs().max()).item()
    for name, cfg in cfgs:
        y = dp4a_q3k(x, blocks, K, torch.empty(1, N, dtype=torch.float32), cfg, False)
        out[f"{name}_{tag}"] = ((y - ref).abs().max() / ref.abs().max()).item()
print(json.dumps(out))
"""


def test_dp4a_q3k_equals_its_contract_in_the_interpreter():
    res = run_interpreted(CHECK, timeout=600)
    assert len(res) == 9, res
    for tag in ("k1024_float32", "k1024_bfloat16", "k1536_float32"):
        assert 1e-4 < res[f"rounding_{tag}"] < 2e-2, res  # 8-bit x: a real, small error against the exact product
    for key, err in res.items():
        if not key.startswith("rounding"):
            assert err < 2e-6, (key, res)  # the integer sums are exact: only fp32 sums round


def test_the_fields_rebuild_the_weight():
    from treeflash.kernels.quant.dp4a_q3k import q3k_fields
    from treeflash.kernels.quant.reference import dequantize_ref
    from treeflash.kernels.quant.synthetic import random_blocks

    blocks = random_blocks("Q3_K", 6, 512, torch.Generator().manual_seed(2))
    d, sc, q = q3k_fields(blocks, 512)
    assert q.min() == -4 and q.max() == 3 and sc.min() >= -32 and sc.max() <= 31
    w = (d.repeat_interleave(16, dim=1)[..., None] * sc[..., None] * q).reshape(6, 512)  # exact in fp64
    assert torch.equal(w.float(), dequantize_ref(blocks, "Q3_K", 512))


def test_an_odd_block_count_is_refused():
    from treeflash.kernels.quant.config import Dp4aConfig
    from treeflash.kernels.quant.dp4a_q3k import dp4a_q3k
    from treeflash.kernels.quant.synthetic import random_blocks

    blocks = random_blocks("Q3_K", 4, 768)  # 3 blocks a row: rows are not word-aligned in pairs
    with pytest.raises(ValueError, match=r"K = 768"):
        dp4a_q3k(torch.randn(1, 768), blocks, 768, torch.empty(1, 4), Dp4aConfig(), False)


def test_dp4a_q3k_compiles_for_sm90_with_dp4a(tmp_path):
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import dp4a_q3k
    from treeflash.kernels.quant.config import Dp4aConfig

    fn, cfg = dp4a_q3k.q3k_dp4a_kernel, Dp4aConfig()
    sig = ("XQ", "XD", "W", "Y", "P", "CNT", "N", "ROW_WORDS")
    types = {"XQ": "*i32", "XD": "*fp32", "W": "*i32", "Y": "*bf16", "P": "*fp32", "CNT": "*i32"}
    cst = dict(PPS=10, BLOCK_N=cfg.block_n, UNROLL=cfg.unroll, SPLIT=1, ASM=True)  # K = 5120
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types}  # ROW_WORDS: 4-byte rows
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps))
    ptx = k.asm["ptx"]
    assert "dp4a.u32.s32" in ptx and "dp2a.lo.s32.s32" in ptx and "dp2a.hi.s32.s32" in ptx
    assert "shf.r.clamp.b32" in ptx  # the odd block's words
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx  # x and dx as 16-byte vectors
    # one layout conversion, for the store: the loop keeps every tensor in the loads' layout (no shared memory)
    assert k.asm["ttgir"].count("ttg.convert_layout") == 1
    regs, spills = test_compile.ptxas_spills(ptx, tmp_path)
    assert spills == 0, (regs, spills)
