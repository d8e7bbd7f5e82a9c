"""mma_q4k (exact Q4_K codes into tl.dot, scales after the dot) against its plain-torch contract under
TRITON_INTERPRET=1 (in a subprocess: the interpreter is chosen when triton loads), every form (M == 1
"diag" with the group sums from a dot or a reduction, "group" at any M), with and without a split
over K; and the CUDA form (inline PTX codes, bf16 wgmma) compiles for sm_90 without spills."""

import pytest

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json, torch
from treeflash.kernels.quant import quant_matmul
from treeflash.kernels.quant.config import QuantTuning, Q4kMmaConfig
from treeflash.kernels.quant.mma_q4k import mma_q4k_ref
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(3)
N, K = 100, 1024
blocks = random_blocks("Q4_K", N, K, g)
out = {}
for name, cfg, ms in (("diag", Q4kMmaConfig(), (1,)), ("diag_reduce_nosplit", Q4kMmaConfig(sums_dot=False, min_programs=1), (1,)),
                      ("group", Q4kMmaConfig(scale="group"), (1, 2, 17)), ("group_nosplit", Q4kMmaConfig(min_programs=1), (5,))):
    t = QuantTuning(q4k_gemv_route="mma", q4k_rows_route="mma", q4k_mma=cfg)
    for m in ms:
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(m, K, generator=g).to(dt)
            y = quant_matmul(x, blocks, "Q4_K", K, out_dtype=torch.float32, tuning=t)
            ref = mma_q4k_ref(x, blocks, K, torch.float32)
            out[f"{name}_m{m}_{str(dt)[6:]}"] = ((y - ref).abs().max() / ref.abs().max()).item()
print(json.dumps(out))
"""


def test_mma_q4k_equals_its_contract_in_the_interpreter():
    errs = run_interpreted(CHECK, timeout=600)
    assert len(errs) == 12  # diag 1 + 1, group 3, group_nosplit 1 (M values) x 2 dtypes
    for case, err in errs.items():  # codes and bf16 x are exact in fp32: only the fp32 sums round (~1e-6)
        assert err < 2e-5, (case, err)


@pytest.mark.parametrize("scale,sums_dot", [("diag", True), ("diag", False), ("group", True)])
def test_mma_q4k_compiles_for_sm90_with_wgmma_and_the_ptx_codes(scale, sums_dot, tmp_path):
    test_compile = pytest.importorskip("tests.kernels.quant.test_compile")
    if test_compile.ASTSource is None or not test_compile.PTXAS.exists():
        pytest.skip("triton without ASTSource/GPUTarget or its bundled ptxas")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treeflash.kernels.quant import mma_q4k
    from treeflash.kernels.quant.config import Q4kMmaConfig

    fn, cfg = mma_q4k.q4k_mma_kernel, Q4kMmaConfig()
    sig = ("X", "W", "B", "Y", "P", "M", "N", "K", "ROW_WORDS")
    types = {"X": "*bf16", "W": "*i32", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=20, BLOCK_M=16, BLOCK_N=cfg.block_n, PARTIAL=False, SCALE=scale, ASM=True, SUMS_DOT=sums_dot)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("K", "ROW_WORDS")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "prmt.b32" in ptx
    regs, spills = test_compile.ptxas_spills(ptx, tmp_path)
    assert spills == 0, (regs, spills)
