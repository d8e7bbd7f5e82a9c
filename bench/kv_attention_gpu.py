"""Decode attention over the KV cache on one GPU: every K/V type pair at 32K and 128K context,
timed and reported as a fraction of the bandwidth roofline of the bytes it reads.

    python -m bench.kv_attention_gpu --out out/kv_attention_gpu.json

For each context and pair: a correctness check against the dequantize + SDPA reference (decode,
and a 16-node tree verify), then the kernel time (median, CUDA-graph replay so launch overhead
is not counted; the eager time with launches is reported beside it). The roofline is the copy
bandwidth measured in the same run (a device-to-device copy, bytes read + written), and
fraction = (K + V bytes read) / time / copy bandwidth. About 2 minutes on an H200 (most of it
Triton compiling a kernel per K/V pair); --contexts 32768 halves that.

    python -m bench.kv_attention_gpu --sweep --out out/kv_attention_sweep.json

--sweep instead times the launch variants (attention_launch.VARIANTS less SWEEP_SKIP and flat on
q4_0/tq3_0, plus launch_config's default; --sweep-all: every one) for each K/V pair in --sweep-pairs, decode at every context and the 16-node tree verify
at the first: each variant is first checked against the reference (decode and verify); one that
fails to compile or to match is recorded with its error and skipped. Prints a table of the
fraction of the roofline per variant and writes them all to the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path


import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

from treeflash.kernels.attention import attention_launch as launch
from treeflash.kernels.attention import quant_attention as qa
from treeflash.kernels.kv.kv_quant import Planes, quantize_into
from treeflash.kernels.kv.kv_formats import get_format

TYPES = ("bf16", "q8_0", "q4_0", "tq3_0")
VERIFY_NODES = 16


def copy_bandwidth(nbytes: int) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read and written (median)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def make_planes(name: str, length: int, kv_heads: int, head_dim: int) -> Planes:
    fmt = get_format(name)
    x = torch.randn(length, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    if fmt.is_dense:
        return Planes(name, None, x.to(fmt.dense_dtype))
    scales = torch.empty(length, kv_heads, fmt.num_scales(head_dim), dtype=torch.float16, device="cuda")
    codes = torch.empty(length, kv_heads, fmt.code_bytes(head_dim), dtype=fmt.code_dtype, device="cuda")
    quantize_into(name, x, scales, codes, 0)
    return Planes(name, scales, codes)


def chain_mask(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device="cuda").tril()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def plan(context: int, num_new: int, heads: int, kv_heads: int, head_dim: int, dense_kv: bool) -> tuple[int, int]:
    group = heads // kv_heads
    cfg = launch.launch_config(head_dim, num_new * group, dense_kv)
    m_tiles = triton.cdiv(num_new * group, cfg.block_m)
    return launch.plan_splits(triton.cdiv(context, cfg.block_n), m_tiles * kv_heads, torch.device("cuda"), cfg.programs_per_sm)


def bench_pair(k: Planes, v: Planes, context: int, args, dtype) -> dict:
    heads, head_dim = args.heads, args.head_dim
    scale = head_dim**-0.5
    q1 = torch.randn(1, heads, head_dim, device="cuda", dtype=dtype)
    qv = torch.randn(VERIFY_NODES, heads, head_dim, device="cuda", dtype=dtype)
    mask = chain_mask(VERIFY_NODES)
    # correctness first: the reference dequantizes every row and runs SDPA in fp32
    out = qa.quant_attention(q1, k, v, context - 1, None, scale)
    ref = qa.quant_attention_reference(q1.float(), k, v, context - 1, None, scale)
    err_decode = rel_err(out, ref)
    out = qa.quant_attention(qv, k, v, context - VERIFY_NODES, mask, scale)
    ref = qa.quant_attention_reference(qv.float(), k, v, context - VERIFY_NODES, mask, scale)
    err_verify = rel_err(out, ref)
    ok = err_decode < args.tol and err_verify < args.tol

    def decode():
        qa.quant_attention(q1, k, v, context - 1, None, scale)

    def verify():
        qa.quant_attention(qv, k, v, context - VERIFY_NODES, mask, scale)

    t_graph = do_bench_cudagraph(decode, rep=args.rep_ms, return_mode="median")
    t_eager = do_bench(decode, warmup=10, rep=args.rep_ms, return_mode="median")
    t_verify = do_bench_cudagraph(verify, rep=args.rep_ms, return_mode="median")
    fk, fv = get_format(k.name), get_format(v.name)
    kv_bytes = context * args.kv_heads * (fk.row_bytes(head_dim) + fv.row_bytes(head_dim))
    splits, per_split = plan(context, 1, heads, args.kv_heads, head_dim, fk.is_dense and fv.is_dense)
    return {
        "k_type": k.name,
        "v_type": v.name,
        "context": context,
        "kv_bytes": kv_bytes,
        "splits": splits,
        "blocks_per_split": per_split,
        "decode_us": t_graph * 1e3,
        "decode_us_eager": t_eager * 1e3,
        "verify16_us": t_verify * 1e3,
        "achieved_GBps": kv_bytes / (t_graph * 1e-3) / 1e9,
        "fraction_of_copy_bw": kv_bytes / (t_graph * 1e-3) / args.copy_bw,
        "verify16_fraction_of_copy_bw": kv_bytes / (t_verify * 1e-3) / args.copy_bw,
        "max_rel_err_decode": err_decode,
        "max_rel_err_verify16": err_verify,
        "correct": ok,
    }


def sdpa_baseline(context: int, args, dtype) -> dict:
    """PyTorch SDPA decode over a bf16 cache (what the dense cache runs), for comparison."""
    k = torch.randn(1, args.kv_heads, context, args.head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(1, args.heads, 1, args.head_dim, device="cuda", dtype=dtype)

    def run():
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    t = do_bench_cudagraph(run, rep=args.rep_ms, return_mode="median")
    nbytes = 2 * k.numel() * k.element_size()
    return {"context": context, "decode_us": t * 1e3, "fraction_of_copy_bw": nbytes / (t * 1e-3) / args.copy_bw}


def split_sweep(k: Planes, v: Planes, context: int, args, dtype) -> list[dict]:
    """Decode time against the number of splits, for tuning PROGRAMS_PER_SM."""
    q1 = torch.randn(1, args.heads, args.head_dim, device="cuda", dtype=dtype)
    rows = []
    for s in (8, 16, 32, 64, 128):
        t = do_bench_cudagraph(
            lambda: qa.quant_attention(q1, k, v, context - 1, None, args.head_dim**-0.5, num_splits=s),
            rep=args.rep_ms, return_mode="median",
        )
        rows.append({"k_type": k.name, "v_type": v.name, "context": context, "num_splits": s, "decode_us": t * 1e3})
    return rows


SWEEP_PAIRS = ("q8_0/q8_0", "q4_0/q4_0", "tq3_0/tq3_0", "q8_0/tq3_0")  # more mixed pairs: --sweep-pairs bf16/tq3_0 ...
# variants the sweep leaves out: flat reads q4_0/tq3_0 at 0.01-0.03 of the roofline (measured on the
# H200, bench/results/kv_attention_sweep.json); --sweep-all times them too
SWEEP_SKIP = {
    "fast_n32_w4_pf": lambda kt, vt: True,  # launch_config's default for most pairs: timed as "default"
}


def sweep_names(kt: str, vt: str, everything: bool = False) -> list[str]:
    """default, then the VARIANTS worth timing on a K/V pair (flat only where neither side is q4_0/tq3_0;
    the int8 q.k variants only on a q8_0 K, flat ones only where V is not q4_0/tq3_0; split ones only where
    a side is q4_0/tq3_0, split8_* (split_q8) only where a side is q8_0: elsewhere each is another one)."""
    names = ["default"]
    for name in launch.VARIANTS:
        if everything:
            names.append(name)
        elif name in SWEEP_SKIP and SWEEP_SKIP[name](kt, vt):
            continue
        elif name.startswith("flat") and ({kt, vt} & {"q4_0", "tq3_0"}):
            continue
        elif launch.VARIANTS[name].get("dequant") == "split" and not (
            "q8_0" in (kt, vt) if launch.VARIANTS[name].get("split_q8") else {kt, vt} & {"q4_0", "tq3_0"}
        ):
            continue
        else:
            names.append(name)
    return names


def sweep_variant(k: Planes, v: Planes, context: int, name: str, args, dtype, verify: bool) -> dict:
    """One launch variant on one K/V pair and context: correctness, then CUDA-graph times."""
    heads, head_dim, scale = args.heads, args.head_dim, args.head_dim**-0.5
    group = heads // args.kv_heads
    row = {"k_type": k.name, "v_type": v.name, "context": context, "variant": name}
    try:
        # "default": what quant_attention picks for this pair (the q8_0/q8_0 and dense choices included)
        pair = dict(dense_kv=k.name not in qa.FMT_IDS and v.name not in qa.FMT_IDS,
                    compressed_kv=k.name in qa.FMT_IDS and v.name in qa.FMT_IDS, tq3_side="tq3_0" in (k.name, v.name))
        cfg1 = launch.launch_config(head_dim, group, **pair) if name == "default" else launch.variant_config(name, head_dim, group)
        cfgv = launch.launch_config(head_dim, VERIFY_NODES * group, **pair)
        if name != "default":
            cfgv = launch.variant_config(name, head_dim, VERIFY_NODES * group)
        row["config"] = {"decode": vars_of(cfg1), "verify16": vars_of(cfgv)}
        # the schemes each side runs, decode and verify16 (a split variant runs "words" on a q8_0 side unless
        # split_q8, and wherever its parts do not fit: attention_launch.split_fits)
        fk, fv = qa.FMT_IDS.get(k.name, 0), qa.FMT_IDS.get(v.name, 0)
        row["schemes"] = list(launch._schemes(cfg1, fk, fv, dtype, head_dim))
        row["schemes_verify16"] = list(launch._schemes(cfgv, fk, fv, dtype, head_dim))
        q1 = torch.randn(1, heads, head_dim, device="cuda", dtype=dtype)
        qv = torch.randn(VERIFY_NODES, heads, head_dim, device="cuda", dtype=dtype)
        mask = chain_mask(VERIFY_NODES)
        key_mask = torch.ones(1, context, dtype=torch.bool, device="cuda")

        def decode():
            return qa.quant_attention(q1, k, v, context - 1, None, scale, config=cfg1)

        def decode_static():
            return qa.quant_attention_masked(q1, k, v, key_mask, scale, config=cfg1)

        def tree():
            return qa.quant_attention(qv, k, v, context - VERIFY_NODES, mask, scale, config=cfgv)

        row["max_rel_err_decode"] = rel_err(decode(), qa.quant_attention_reference(q1.float(), k, v, context - 1, None, scale))
        errs = [row["max_rel_err_decode"]]
        if verify:  # the first context only: each check compiles one more kernel
            ref = qa.quant_attention_masked_reference(q1.float(), k, v, key_mask, scale)
            row["max_rel_err_static"] = rel_err(decode_static(), ref)
            errs.append(row["max_rel_err_static"])
            ref = qa.quant_attention_reference(qv.float(), k, v, context - VERIFY_NODES, mask, scale)
            row["max_rel_err_verify16"] = rel_err(tree(), ref)
            errs.append(row["max_rel_err_verify16"])
        row["correct"] = all(e < args.tol for e in errs)
        if not row["correct"]:
            return row
        fk, fv = get_format(k.name), get_format(v.name)
        kv_bytes = context * args.kv_heads * (fk.row_bytes(head_dim) + fv.row_bytes(head_dim))
        t = do_bench_cudagraph(decode, rep=args.rep_ms, return_mode="median")
        row |= {"kv_bytes": kv_bytes, "decode_us": t * 1e3, "fraction_of_copy_bw": kv_bytes / (t * 1e-3) / args.copy_bw}
        if verify:
            t = do_bench_cudagraph(tree, rep=args.rep_ms, return_mode="median")
            row |= {"verify16_us": t * 1e3, "verify16_fraction_of_copy_bw": kv_bytes / (t * 1e-3) / args.copy_bw}
    except Exception as e:  # a variant that does not compile (or runs out of resources) must not end the run
        row |= {"correct": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    return row


def vars_of(cfg) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)


def run_sweep(args, dtype) -> list[dict]:
    pairs = [tuple(p.split("/")) for p in args.sweep_pairs]
    names = ["default", *launch.VARIANTS]
    if args.sweep_variants:
        names = ["default", *args.sweep_variants]
    if not args.sweep_all:
        names = [n for n in names if any(n in sweep_names(kt, vt) for kt, vt in pairs)]
    rows = []
    for context in args.contexts:
        types = sorted({t for p in pairs for t in p})
        k_planes = {t: make_planes(t, context, args.kv_heads, args.head_dim) for t in types}
        v_planes = {t: make_planes(t, context, args.kv_heads, args.head_dim) for t in types}
        for kt, vt in pairs:
            for name in [n for n in sweep_names(kt, vt, args.sweep_all) if n in names]:
                verify = context == args.contexts[0]
                if time.time() - args.t0 > args.sweep_budget_s:
                    rows.append({"k_type": kt, "v_type": vt, "context": context, "variant": name, "correct": None,
                                 "error": f"skipped: past --sweep-budget-s {args.sweep_budget_s}"})
                    continue
                r = sweep_variant(k_planes[kt], v_planes[vt], context, name, args, dtype, verify)
                rows.append(r)
                if "decode_us" in r:
                    tail = f"verify16 {r['verify16_us']:7.1f} us ({r['verify16_fraction_of_copy_bw']:.2f})" if verify else ""
                    print(f"{context:>7} {kt:>6}/{vt:<6} {name:<18} decode {r['decode_us']:7.1f} us "
                          f"({r['fraction_of_copy_bw']:.2f} of copy bw)  {tail}", flush=True)
                else:
                    print(f"{context:>7} {kt:>6}/{vt:<6} {name:<18} FAILED {r.get('error', r)}", flush=True)
            print(f"  [{time.time() - args.t0:.0f} s]", flush=True)
        del k_planes, v_planes
        torch.cuda.empty_cache()
    print("\nfraction of the roofline, decode (best per pair and context marked *):")
    keys = sorted({(r["context"], r["k_type"], r["v_type"]) for r in rows})
    print(f"{'context':>7} {'K/V':<13} " + " ".join(f"{n[:18]:>18}" for n in names))
    for key in keys:
        got = {r["variant"]: r.get("fraction_of_copy_bw") for r in rows if (r["context"], r["k_type"], r["v_type"]) == key}
        best = max((f for f in got.values() if f is not None), default=None)
        cells = [("-" if got.get(n) is None else f"{got[n]:.2f}" + ("*" if got[n] == best else " ")) for n in names]
        print(f"{key[0]:>7} {key[1] + '/' + key[2]:<13} " + " ".join(f"{c:>18}" for c in cells))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n  python -m bench.kv_attention_gpu --out out/kv_attention_gpu.json\n"
        "  python -m bench.kv_attention_gpu --sweep --out out/kv_attention_sweep.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="path of the JSON artifact")
    ap.add_argument("--sweep", action="store_true", help="time every launch variant (attention_launch.VARIANTS)")
    ap.add_argument("--sweep-pairs", nargs="+", default=list(SWEEP_PAIRS), help="K/V pairs for --sweep, e.g. q8_0/q8_0")
    ap.add_argument("--sweep-all", action="store_true", help="--sweep times every variant on every pair (no SWEEP_SKIP)")
    ap.add_argument("--sweep-variants", nargs="+", choices=list(launch.VARIANTS), help="--sweep times only these (and the default)")
    ap.add_argument("--sweep-budget-s", type=float, default=270.0, help="--sweep skips what is left after this long")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--types", nargs="+", default=list(TYPES), help="K and V types to pair (all pairs)")
    ap.add_argument("--heads", type=int, default=24, help="query heads (default: Qwen3.5-27B full attention)")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--rep-ms", type=int, default=25, help="timing budget per measurement")
    ap.add_argument("--tol", type=float, default=2e-2, help="max relative error against the reference")
    args = ap.parse_args()
    for pair in args.sweep_pairs:
        if len(pair.split("/")) != 2 or not all(t in TYPES for t in pair.split("/")):
            ap.error(f"--sweep-pairs: {pair!r} is not K/V with types from {', '.join(TYPES)}")
    if not torch.cuda.is_available():
        sys.exit("kv_attention_gpu: needs a CUDA GPU")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    t0 = args.t0 = time.time()
    torch.manual_seed(0)
    args.copy_bw = copy_bandwidth(2 << 30)
    print(f"copy bandwidth {args.copy_bw / 1e9:.0f} GB/s", flush=True)
    if args.sweep:
        rows = run_sweep(args, dtype)
        report = {
            "bench": "kv_attention_gpu --sweep",
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": args.dtype},
            "copy_bandwidth_GBps": args.copy_bw / 1e9,
            "timing": "median, CUDA-graph replay; verify16 at the first context only",
            "variants": {"default": "launch_config's choice", **launch.VARIANTS},
            "all_correct": all(r["correct"] is not False for r in rows),
            "results": rows,
            "wall_s": time.time() - t0,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out} in {report['wall_s']:.0f} s; all correct: {report['all_correct']}")
        return
    results, baselines, sweep = [], [], []
    for context in args.contexts:
        k_planes = {t: make_planes(t, context, args.kv_heads, args.head_dim) for t in args.types}
        v_planes = {t: make_planes(t, context, args.kv_heads, args.head_dim) for t in args.types}
        baselines.append(sdpa_baseline(context, args, dtype))
        for kt, vt in itertools.product(args.types, args.types):
            r = bench_pair(k_planes[kt], v_planes[vt], context, args, dtype)
            results.append(r)
            print(
                f"{context:>7} K={kt:<6} V={vt:<6} decode {r['decode_us']:7.1f} us "
                f"({r['fraction_of_copy_bw']:.2f} of copy bw, eager {r['decode_us_eager']:.1f} us)  "
                f"verify16 {r['verify16_us']:7.1f} us  err {r['max_rel_err_decode']:.1e}/{r['max_rel_err_verify16']:.1e}"
                + ("" if r["correct"] else "  WRONG"),
                flush=True,
            )
        if context == args.contexts[0] and "q8_0" in args.types:
            sweep = split_sweep(k_planes["q8_0"], v_planes["q8_0"], context, args, dtype)
        del k_planes, v_planes
        torch.cuda.empty_cache()
    report = {
        "bench": "kv_attention_gpu",
        "device": torch.cuda.get_device_name(),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": args.dtype},
        "copy_bandwidth_GBps": args.copy_bw / 1e9,
        "timing": "median; CUDA-graph replay (decode_us, verify16_us), eager launches (decode_us_eager)",
        "all_correct": all(r["correct"] for r in results),
        "results": results,
        "sdpa_bf16_baseline": baselines,
        "split_sweep": sweep,
        "wall_s": time.time() - t0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out} in {report['wall_s']:.0f} s; all correct: {report['all_correct']}")
    if not report["all_correct"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
