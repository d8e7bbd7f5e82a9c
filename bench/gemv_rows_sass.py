"""Offline sm_90a compile of the GEMV kernels, one-row against rows mode: same instruction mix per row?

    python bench/gemv_rows_sass.py          # no GPU: Triton's own ptxas and cuobjdump, sm_90a

Rows mode (kernels/gemv_rows.py) promises every row bit for bit what the one-row kernel gives it.
The interpreter tests check that with numpy's arithmetic; on the GPU it also needs the compiler to
contract the same multiply-adds into FFMA. This compiles both kernels at a SmolLM2 configuration and
counts the float instructions of each. Equal FFMA / FMUL / FADD / SHFL counts per row are the
offline evidence; `bench/gemv_rows_check.py` is the test on a GPU. Pointer arguments get 16-byte
divisibility, as the JIT gives them. The commit kernel is compiled too, for its registers.
"""

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from treeflash.kernels.gemv import _gemv_kernel, _gemv_swiglu_kernel
from treeflash.kernels.gemv_rows import _gemv_rows_kernel
from treeflash.kernels.commit import _commit_rows_kernel
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/")

def comp(fn, sig, consts, warps, div=()):
    names = list(fn.arg_names)
    sig = dict(sig); sig.update({k: "constexpr" for k in consts})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"; ptx.write_text(k.asm["ptx"])
        out = subprocess.run([BIN + "ptxas", "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(Path(d) / "k.cubin")], capture_output=True, text=True)
        sass = subprocess.run([BIN + "cuobjdump", "-sass", str(Path(d) / "k.cubin")], capture_output=True, text=True).stdout
    regs = re.findall(r"Used (\d+) registers", out.stdout + out.stderr)
    ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\d+\s+)?([A-Z0-9_.]+)", sass, re.M))
    return regs, {o: ops[o] for o in ("FFMA", "FMUL", "FADD", "LDG", "STG", "BAR", "SHFL")}

N, K, BN, BK, W = 960, 576, 4, 512, 8
one_sig = dict(X="*bf16", W="*bf16", B="*bf16", Y="*bf16", P="*fp32", T="*i32", N="i32", R="*bf16", NW="*bf16", S="*bf16", YN="*bf16", TA="*i32", eps="fp32")
one = dict(K=K, HAS_BIAS=False, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=1, K_SPLIT=1024, NORM=False, UNIT=False, N_BLOCKS=1, BLOCK_FULL=1, PDL=True, NORM_IN=False)
print("one-row gemv", comp(_gemv_kernel, one_sig, one, W, div=("X", "W", "Y")))
rows_sig = dict(X="*bf16", W="*bf16", B="*bf16", Y="*bf16", M="i32", N="i32")
for g in (1, 8):
    print(f"rows gemv g{g}", comp(_gemv_rows_kernel, rows_sig, dict(K=K, HAS_BIAS=False, SWIGLU=False, BLOCK_N=BN, BLOCK_K=BK, STEPS=2, GROUP=g, PDL=True), W, div=("X", "W", "Y")))
sw_sig = dict(X="*bf16", W="*bf16", Y="*bf16", I="i32", R="*bf16", NW="*bf16", S="*bf16", eps="fp32")
print("one-row swiglu", comp(_gemv_swiglu_kernel, sw_sig, dict(K=576, BLOCK_N=2, BLOCK_K=1024, STEPS=1, PDL=True, NORM_IN=False, UNIT=False), 4, div=("X", "W", "Y")))
print("rows swiglu g8", comp(_gemv_rows_kernel, rows_sig, dict(K=576, HAS_BIAS=False, SWIGLU=True, BLOCK_N=2, BLOCK_K=1024, STEPS=1, GROUP=8, PDL=True), 4, div=("X", "W", "Y")))
c_sig = dict(TABLE="*i64", DEST="*i64", SRC="*i64", N="*i64")  # the buffers' addresses in a table (kernels/commit.py)
print("commit_rows P32", comp(_commit_rows_kernel, c_sig, dict(ROW=192, P=32, P2=32, BLOCK=256, ELT=tl.int16, PDL=True), 4))
