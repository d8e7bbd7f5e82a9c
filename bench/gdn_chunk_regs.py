"""Registers and spills of the Gated DeltaNet tree chunk kernel (kernels/gdn_tree.py:
_tree_chunk_kernel) at the Qwen3.5-27B shape, from an offline sm_90a compile: no GPU needed (Triton
compiles to PTX, its bundled ptxas -v reports the registers and spill bytes per launch config).

    python bench/gdn_chunk_regs.py                       # the default grid of (nodes, v columns, warps)
    python bench/gdn_chunk_regs.py --configs 32,16,8 16,32,4
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from treeflash.kernels.gdn_tree import _tree_chunk_kernel  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
SIG = {"QK": "*fp32", "GB": "*fp32", "Y": "*fp32", "S0": "*fp32", "MASK": "*i1", "O": "*fp32", "T": "i32", "HV": "i32",
       "C": "i32", "stride_mask": "i32", "TP": "constexpr", "LOG2_TP": "constexpr", "GROUP": "constexpr", "HK": "constexpr",
       "DK": "constexpr", "DKC": "constexpr", "DV": "constexpr", "BV": "constexpr", "PDL": "constexpr"}


def compile_stats(tp: int, bv: int, warps: int) -> dict:
    consts = {"TP": tp, "LOG2_TP": tp.bit_length() - 1, "GROUP": 3, "HK": 16, "DK": 128, "DKC": 32, "DV": 128, "BV": bv, "PDL": True}
    k = triton.compile(ASTSource(fn=_tree_chunk_kernel, signature=SIG, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps})
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(Path(d) / "k.cubin")], capture_output=True, text=True)
    txt = out.stdout + out.stderr
    regs = re.findall(r"Used (\d+) registers", txt)
    spill = re.findall(r"(\d+) bytes spill stores", txt)
    return {"nodes": tp, "block_v": bv, "warps": warps, "registers": int(regs[0]) if regs else None,
            "spill_store_bytes": int(spill[0]) if spill else None, "shared_bytes": k.metadata.shared}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="*", default=["16,16,8", "16,32,4", "32,8,4", "32,16,4", "32,16,8", "32,32,4", "32,32,8"],
                   help="nodes (a power of two >= 16),v columns,warps")
    args = p.parse_args()
    for cfg in args.configs:
        tp, bv, w = (int(v) for v in cfg.split(","))
        print(compile_stats(tp, bv, w), flush=True)


if __name__ == "__main__":
    main()
