"""Offline sm_90a compile of the compressed-KV decode attention kernel (kernels/quant_attention.py:
_partial_kernel) under launch variants, "words" against "split" and "split8" (q8_0 sides split too,
LaunchConfig.split_q8; kernels/kv_split.py): registers,
spills and SASS instructions of the inner loop (one step of BLOCK_N keys). No GPU needed: Triton
compiles to PTX, its bundled ptxas and cuobjdump give the registers and the SASS.

    python bench/kv_split_sass.py          # tq3_0/tq3_0, q4_0/q4_0, q8_0/q8_0 and the mixed q8_0 pairs
    python bench/kv_split_sass.py --pairs q8_0/q8_0 q8_0/tq3_0 q8_0/q4_0 --variants words_n32_w4 split_n32_w4 split8_n32_w4
    python bench/kv_split_sass.py --rows 96 ...   # a 16-node verify's tile (96 query rows: 32-row tiles)
    python bench/kv_split_sass.py --head-dim 128 --variants words_n64_w8 split_n64_w4 --pairs q4_0/q4_0
    python bench/kv_split_sass.py --json out/kv_split_sass.json

Each variant is compiled as quant_attention launches it for decode at Qwen3.5-27B's attention shape
(24 query / 4 KV heads: 6 query rows in a 16-row tile), a bf16 query (fp32 once rotated for a tq3_0 K),
many splits (no direct store), PDL on, the loop bound read at run time, and the pointer and stride
arguments given 16-byte divisibility as the JIT gives them (without it Triton does not pipeline the
loads). Each side's scheme and dot type come from attention_launch._schemes / _dot_dtypes, so a q8_0
side under a split variant compiles as "words" (as "split" under split8_*), as it runs. The inner loop is the largest backward
branch whose body holds an HMMA. `smem_tiles` counts the loop's local_alloc ops in the TTGIR: 1 means
only p goes through shared memory on its way to the p.v dot; more means dequantized K or V tiles make
a shared-memory round trip before their dot (ldmatrix), instead of being dequantized in the dot
operand's layout. Instruction counts are static: only the GPU sweep (bench/kv_attention_gpu.py) says
which is faster.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from treeflash.kernels import kv_formats as formats  # noqa: E402
from treeflash.kernels import quant_attention as qa  # noqa: E402
from treeflash.kernels.attention_launch import FMT_IDS, _dot_dtypes, _schemes, variant_config  # noqa: E402
from treeflash.kernels.kv_dequant import DEQ_IDS  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/")
PAIRS = ("tq3_0/tq3_0", "q4_0/q4_0", "q8_0/q8_0", "q8_0/tq3_0", "tq3_0/q8_0", "q8_0/q4_0")
TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}
SHOWN = ("HMMA", "LDS", "LDSM", "STS", "PRMT", "LOP3", "IMAD", "HMUL2", "SHF")


def compile_decode(k_type: str, v_type: str, variant: str, head_dim: int, group: int = 6, rows: int | None = None) -> dict:
    """Compile _partial_kernel for one launch of `rows` query rows (None: decode, one token x the GQA
    group); its registers, spills and instruction counts."""
    cfg = variant_config(variant, head_dim, rows or group)
    fk, fv = FMT_IDS.get(k_type, 0), FMT_IDS.get(v_type, 0)
    deq_k, deq_v = _schemes(cfg, fk, fv, torch.bfloat16, head_dim)
    dot_k, dot_v = _dot_dtypes(deq_k, deq_v, torch.bfloat16)
    codes = {0: "*bf16", 1: "*i8", 2: "*u8", 3: "*u8"}
    fn = qa._partial_kernel
    names = list(fn.arg_names)
    sig = dict(q_ptr="*fp32" if k_type == "tq3_0" else "*bf16", ks_ptr="*fp16" if fk else "*bf16", kc_ptr=codes[fk],
               vs_ptr="*fp16" if fv else "*bf16", vc_ptr=codes[fv], mask_ptr="*i8", end_ptr="*i8", m_ptr="*fp32",
               l_ptr="*fp32", acc_ptr="*fp32", out_ptr="*fp32" if v_type == "tq3_0" else "*bf16", ticket_ptr="*fp32",
               start="i32", num_tokens="i32", kv_len="i32", end_idx="i32", num_kv_heads="i32", scale_log2="fp32",
               stride_qt="i32", stride_qh="i32")
    c0, c1, c2, c3 = formats.TQ3_CENTROIDS
    consts = dict(KEY_MASK=False, HAS_END=False, DYN_LOOP=True, FUSE_COMBINE=False, NUM_SPLITS=1, DIRECT=False,
                  SKIP_EMPTY=False, GROUP=group, D=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCKS_PER_SPLIT=16,
                  FMT_K=fk, FMT_V=fv, DOT=TL[dot_k], PREFETCH=cfg.prefetch, DEQ=DEQ_IDS[deq_k], C0=c0, C1=c1, C2=c2,
                  C3=c3, PDL=True, DEQ_V=DEQ_IDS[deq_v], ASM=True, DOT_V=TL[dot_v])
    sig.update({n: "constexpr" for n in consts})
    div = [n for n in names if n.endswith("_ptr")] + ["stride_qt", "stride_qh"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
    kern = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    with tempfile.TemporaryDirectory() as d:
        ptx = Path(d) / "k.ptx"
        ptx.write_text(kern.asm["ptx"])
        out = subprocess.run([BIN + "ptxas", "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(Path(d) / "k.cubin")],
                             capture_output=True, text=True, check=True)
        sass = subprocess.run([BIN + "cuobjdump", "-sass", str(Path(d) / "k.cubin")], capture_output=True, text=True,
                              check=True).stdout
    log = out.stdout + out.stderr
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
    loop = loop_body(ins)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in loop)
    ttgir_loop = kern.asm["ttgir"].split("scf.for", 1)[-1].split("scf.yield", 1)[0]
    return {
        "k_type": k_type, "v_type": v_type, "variant": variant, "head_dim": head_dim, "schemes": [deq_k, deq_v],
        "rows": rows or group, "block_m": cfg.block_m, "block_n": cfg.block_n, "warps": cfg.num_warps,
        "registers": int(re.findall(r"Used (\d+) registers", log)[0]),
        "spill_bytes": sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", log)),
        "loop_instructions": len(loop), "total_instructions": len(ins),
        "smem_tiles": ttgir_loop.count("ttg.local_alloc %"),
        "loop_ops": {op: ops[op] for op in SHOWN},
    }


def loop_body(ins: list[tuple[int, str]]) -> list[str]:
    """The instructions of the largest backward-branch region that holds an HMMA (the key loop)."""
    best: list[str] = []
    for addr, text in ins:
        m = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [x for a, x in ins if int(m.group(1), 16) <= a <= addr]
            if any("HMMA" in x for x in body) and len(body) > len(best):
                best = body
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), help="K/V type pairs")
    ap.add_argument("--variants", nargs="+", default=["words_n32_w4", "split_n32_w4", "split8_n32_w4"],
                    help="attention_launch.VARIANTS names")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--rows", type=int, default=6, help="query rows (tokens x GQA group): 6 decode, 96 a 16-node verify")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = []
    tile = variant_config(args.variants[0], args.head_dim, args.rows).block_m
    print(f"head_dim {args.head_dim}, {args.rows} query rows ({tile}-row tiles), sm_90a; loop = SASS instructions per key step")
    print(f"{'K/V':<12} {'variant':<14} {'schemes K/V':<18} {'regs':>4} {'spill':>5} {'loop':>5} {'total':>5} {'smem':>4}  "
          + " ".join(f"{o:>5}" for o in SHOWN))
    for pair in args.pairs:
        k_type, v_type = pair.split("/")
        for variant in args.variants:
            r = compile_decode(k_type, v_type, variant, args.head_dim, rows=args.rows)
            rows.append(r)
            print(f"{pair:<12} {variant:<14} {'/'.join(r['schemes']):<18} {r['registers']:>4} {r['spill_bytes']:>5} "
                  f"{r['loop_instructions']:>5} {r['total_instructions']:>5} {r['smem_tiles']:>4}  "
                  + " ".join(f"{r['loop_ops'][o]:>5}" for o in SHOWN), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"bench": "kv_split_sass", "triton": triton.__version__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
