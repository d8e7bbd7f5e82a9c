"""The mmq kernels (mmq_q4k, mmq_q6k: small M, x rounded to 8 bits per group of 32, int8 dots) against their
plain-torch contracts, run under TRITON_INTERPRET=1 in a subprocess by tests/kernels/quant/test_mmq_q4k.py and
test_mmq_q6k.py.

`python -m tests.kernels.quant.mmq_checks FMT` prints one JSON line: per case (M, configuration) "rel" (max error
against the reference on the same quantized x, relative to its largest value), "equal" (bitwise equal to it),
"split"; "invariant" (every row of every call bitwise equal to the same row of x in any other call, whatever M or
its position, and to the one-row calls); "decode" (M rows against quant_matmul's M == 1 route, dp4a, row by row,
at the decode step's split); "route" (quant_matmul with rows route "mmq" is the kernel).
"""

from __future__ import annotations

import json
import sys

import torch

# N = 40: a ragged tail of every BLOCK_N; K: two units of the split over K (Q4_K: blocks, Q6_K: pairs of blocks)
N = 40
K = {"Q4_K": 512, "Q6_K": 1024}
MS = (2, 5, 16, 33, 64)
# (name, MmqConfig fields, Ms): no split at every M; a split of 2 (BLOCK_N 32: 2 programs, at least 4) at two;
# BLOCK_M 16 (M = 33 takes three tiles of x) at one
# (Q6_K, four times the interpreter's work a call: fewer cases)
CONFIGS = {"Q4_K": (("nosplit", {"min_programs": 1}, MS), ("split", {"block_n": 32, "min_programs": 4}, (5, 64)),
                    ("bm16", {"block_m": 16, "min_programs": 1}, (33,))),
           "Q6_K": (("nosplit", {"min_programs": 1}, (2, 17)), ("split", {"block_n": 32, "min_programs": 4}, (5,)))}
DECODE_ROWS = {"Q4_K": 5, "Q6_K": 2}
SINGLES = (17, 63)  # rows of x also computed alone, once per split


def case_names(fmt: str) -> list[str]:
    """The per-call cases main() prints for fmt, in its order."""
    return [f"{name}_m{m}" for name, _, ms in CONFIGS[fmt] for m in ms]


def main(fmt: str) -> None:
    from treeflash.kernels.quant import quant_matmul
    from treeflash.kernels.quant.config import Dp4aConfig, MmqConfig, QuantTuning
    from treeflash.kernels.quant.dp4a_q4k import quantize_x
    from treeflash.kernels.quant.synthetic import random_blocks

    k = K[fmt]
    if fmt == "Q4_K":
        from treeflash.kernels.quant.mmq_q4k import mmq_q4k as kernel, mmq_q4k_ref as ref_fn, mmq_split
        nb_split = k // 256
        route = dict(q4k_rows_route="mmq")
    else:
        from treeflash.kernels.quant.mmq_q6k import mmq_q6k as kernel, mmq_q6k_ref as ref_fn, mmq_split
        nb_split = k // 512  # Q6_K splits over pairs of blocks
        route = dict(q6k_rows_route="mmq")
    gen = torch.Generator().manual_seed(11)
    blocks = random_blocks(fmt, N, k, gen)
    x_all = torch.randn(64, k, generator=gen) * torch.rand(64, 1, generator=gen) * 3  # [64, k] fp32: rows of varied size
    x_all[5, 96:128] = 0  # a group of zeros: dx == 0
    # (split, source row) -> its outputs, each of which must be bitwise equal: a row's order of fp32 sums depends on
    # the split only (not on M, BLOCK_M, BLOCK_N or its position)
    out, rows_seen = {}, {}

    def call(x, cfg):
        y = torch.empty(x.shape[0], N)
        return kernel(x.contiguous(), blocks, k, y, cfg, False)

    for name, fields, ms in CONFIGS[fmt]:
        cfg = MmqConfig(**fields)
        split = mmq_split(N, nb_split, cfg)
        for m in ms:
            # which rows of x_all, in a random order: SINGLES first (so every call holds rows also computed alone), then others
            others = [r for r in torch.randperm(64, generator=gen).tolist() if r not in SINGLES]
            src = torch.tensor(list(SINGLES) + others)[:m][torch.randperm(m, generator=gen)]
            x = x_all[src]
            y = call(x, cfg)
            ref = ref_fn(x, blocks, k, torch.float32, quantized=quantize_x(x), split=split)
            out[f"{name}_m{m}"] = dict(rel=((y - ref).abs().max() / ref.abs().max()).item(), equal=torch.equal(y, ref), split=split)
            for i, r in enumerate(src.tolist()):
                rows_seen.setdefault((split, r), []).append(y[i])
        if (split, "alone") not in rows_seen:
            rows_seen[(split, "alone")] = []
            for r in SINGLES:
                rows_seen.setdefault((split, r), []).append(call(x_all[r:r + 1], cfg)[0])
    out["invariant"] = all(torch.equal(ys[0], y) for ys in rows_seen.values() for y in ys)
    out["invariant_rows"] = sum(len(ys) for ys in rows_seen.values() if len(ys) > 1)
    # the decode step (M == 1, dp4a) on each row against an M-row call at the same split and block_n
    dp = Dp4aConfig()
    cfg = MmqConfig(block_n=dp.block_n, min_programs=dp.min_programs)
    x = x_all[:DECODE_ROWS[fmt]]
    y = call(x, cfg)
    one = torch.cat([quant_matmul(x[i:i + 1], blocks, fmt, k, out_dtype=torch.float32, tuning=QuantTuning()) for i in range(x.shape[0])])
    out["decode"] = dict(equal=torch.equal(y, one), rel=((y - one).abs().max() / one.abs().max()).item())
    # the route: bf16 x and output through quant_matmul, against the kernel called directly
    xb = x_all[:3].to(torch.bfloat16)
    y = quant_matmul(xb, blocks, fmt, k, tuning=QuantTuning(**route))
    direct = kernel(xb, blocks, k, torch.empty(3, N, dtype=torch.bfloat16), MmqConfig(), False)
    out["route"] = dict(equal=torch.equal(y, direct), dtype=str(y.dtype))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
