"""The quant kernels compile for an H100/H200 (sm_90) on this CPU-only machine: triton.compile runs
the whole pipeline down to ptxas (bundled with triton), which catches what the interpreter does not
check (the compiler's typing and control-flow rules). And the GEMV reads Q4_K's codes with 16-byte
vector loads at the default configuration: the wide-load design holds in the generated PTX."""

import re
import subprocess
from pathlib import Path

import pytest
import triton

from treeflash.kernels.quant import FORMATS
from treeflash.kernels.quant.config import GemvConfig, RowsConfig
from treeflash.kernels.quant.decode import FMT_ID, GROUPS

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - an older triton
    GPUTarget = ASTSource = None

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
K = 5120  # the 27B hidden size: 20 superblocks, 160 small blocks


def compile_kernel(name: str, fmt: str):
    from treeflash.kernels.quant import kernels

    f = FORMATS[fmt]
    s, g, min_mode = GROUPS[fmt]
    meta = dict(FMT=FMT_ID[fmt], QK=f.block_values, BB=f.block_bytes, S=s, G=g, MIN_MODE=min_mode)
    gemv, rows = GemvConfig(), RowsConfig()
    fn, sig, cst, warps = {
        "gemv": (kernels.gemv_kernel, ("X", "B", "H", "Y", "N", "ROW_BYTES"),
                 dict(NUM_BLOCKS=K // f.block_values, **meta, BLOCK_N=gemv.block_n, UNROLL=gemv.unroll), gemv.num_warps),
        "rows": (kernels.rows_kernel, ("X", "B", "H", "Y", "M", "N", "K", "ROW_BYTES"),
                 dict(NUM_BLOCKS=K // f.block_values, **meta, BLOCK_M=16, BLOCK_N=rows.block_n, DOT_F32=False), rows.num_warps),
        "dequant": (kernels.dequant_kernel, ("B", "H", "W", "N", "K", "ROW_BYTES"), dict(**meta, BLOCK_N=16), 4),
    }[name]
    types = {"X": "*bf16", "Y": "*bf16", "W": "*bf16", "B": "*u8", "H": "*fp16"}
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    # what a launch with torch tensors and a row size divisible by 16 specializes on
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a == "ROW_BYTES"}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))


needs_ptxas = pytest.mark.skipif(ASTSource is None or not PTXAS.exists(),
                                 reason="triton without ASTSource/GPUTarget or without its bundled ptxas")


@needs_ptxas
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kernels_compile_for_sm90(fmt):
    for name in ("gemv", "rows") + (("dequant",) if fmt in ("Q4_K", "Q6_K") else ()):
        assert compile_kernel(name, fmt).asm["cubin"], (fmt, name)


@needs_ptxas
def test_q4_k_gemv_loads_codes_as_vectors():
    ptx = compile_kernel("gemv", "Q4_K").asm["ptx"]
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx), "no 16-byte loads in the Q4_K GEMV"


def compile_q4k_words(block_n: int = 16, unroll: int = 2, warps: int = 1, x_tile: bool = False):
    from treeflash.kernels.quant import gemv_q4k

    fn = gemv_q4k.q4k_gemv_kernel
    sig = ("X", "W", "B", "Y", "P", "N", "ROW_WORDS")
    types = {"X": "*bf16", "W": "*i32", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=K // 256, SPLIT=1, BLOCK_N=block_n, UNROLL=unroll, X_TILE=x_tile)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a == "ROW_WORDS"}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))


@needs_ptxas
def test_q4_k_word_gemv_compiles_with_wide_loads_and_no_int_to_float_per_value():
    ptx = compile_q4k_words().asm["ptx"]
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4\.b32", ptx)) >= 8, "the codes are not read as 16-byte vectors"
    # the scales and mins (16 a block per row) are the only integers converted; the codes take the 2^23 trick
    assert len(re.findall(r"cvt\.rn\.f32\.[us]32", ptx)) <= 16 * 2


@needs_ptxas
def test_q4_k_word_gemv_x_tile_reads_x_without_a_shared_memory_shuffle():
    ptx = compile_q4k_words(x_tile=True).asm["ptx"]
    assert "bar.sync" not in ptx and "st.shared" not in ptx, "x still goes through shared memory"
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4\.b32", ptx)) >= 8 + 32  # codes, and x as 16-byte vectors


def compile_q4k_rows(block_m: int, partial: bool, cfg=None):
    """rows_q4k's kernel for bf16 x at K = 5120 (BPS 20), as a launch with torch tensors specializes it."""
    from treeflash.kernels.quant import rows_q4k
    from treeflash.kernels.quant.config import Q4kRowsConfig

    cfg = cfg or Q4kRowsConfig()
    fn = rows_q4k.q4k_rows_kernel
    sig = ("X", "W", "B", "Y", "P", "M", "N", "K", "ROW_WORDS")
    types = {"X": "*bf16", "W": "*i32", "B": "*u8", "Y": "*bf16", "P": "*fp32"}
    cst = dict(BPS=K // 256, BLOCK_M=block_m, BLOCK_N=cfg.block_n, PARTIAL=partial, ROUND_W=True, DOT_F32=False)
    signature = {a: types.get(a, "i32") for a in sig} | {a: "constexpr" for a in cst}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in types or a in ("N", "K", "ROW_WORDS")}
    src = ASTSource(fn, signature, constexprs={(fn.arg_names.index(a),): v for a, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def ptxas_spills(ptx: str, tmp_path: Path) -> tuple[int, int]:
    """(registers, spill bytes stored + loaded) that ptxas reports for the PTX on sm_90a."""
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    info = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    regs = re.search(r"Used (\d+) registers", info)
    assert spills and regs, info
    return int(regs.group(1)), int(spills.group(1)) + int(spills.group(2))


@needs_ptxas
@pytest.mark.parametrize("block_m,partial", [(16, True), (64, False)])
def test_q4_k_rows_compiles_to_wgmma_without_spills(block_m, partial, tmp_path):
    """The default configuration at the smallest and largest BLOCK_M: the K = 64 dots lower to wgmma with the
    dequantized weight as the register A operand, nothing is copied from registers into shared memory (no
    local_alloc of a value: the pipeliner's cp.async puts x straight into the B operand's layout) and the one
    layout conversion is the epilogue's; the code bytes come in 16-byte async copies; ptxas needs no spills."""
    kernel = compile_q4k_rows(block_m, partial)
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    dots = re.findall(r"ttng\.warp_group_dot %.*", ttgir)
    assert len(dots) == 4 and all(re.search(r": tensor<64x64xbf16, #ttg\.dot_op<\{opIdx = 0", d) for d in dots), dots
    assert len(re.findall(r"wgmma\.mma_async", ptx)) >= 16  # 4 dots of K = 64 a block, k16 each
    assert not re.search(r"ttg\.local_alloc %", ttgir)
    assert len(re.findall(r"ttg\.convert_layout", ttgir)) == 1
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)
    regs, spilled = ptxas_spills(ptx, tmp_path)
    assert spilled == 0 and regs <= 255, (regs, spilled)
