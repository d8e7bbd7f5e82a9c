"""Which half of a folded decode layer costs time at a large shape: the two kernel sequences that folding
changes, timed both ways on the H200 with every weight byte from memory (bench/gpu_linear.weight_copies,
CUDA-graph replay, PDL as the model launches them).

    python bench/folded_pieces.py --shape qwen3-8b --out bench/results/s28/folded_pieces.json

mlp half   default: o_proj GEMV, fused add + RMSNorm, gemv_swiglu on the normed row
           folded:  o_proj GEMV adding into the stream (add_into), gemv_swiglu on the raw stream (rows=(s, eps))
attn half  default: down GEMV, fused add + RMSNorm, q/k/v GEMV on the normed row
           folded:  down GEMV adding into the stream, q/k/v GEMV on the raw stream (its 1 / rms is applied
                    by the rotary kernel, which runs in both forms and is not timed here)

Stop 28 measured the whole folded step 2.6% slower than the default at the Qwen3-8B shape (pipelined) and
14% faster at SmolLM2's; this says which half to keep folded, if either, at the large shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.gpu_linear import bench, copy_bandwidth  # noqa: E402
from treeflash.kernels.gemv import gemv, gemv_swiglu  # noqa: E402
from treeflash.kernels.norm import rmsnorm  # noqa: E402

SHAPES = {"qwen3-8b": (4096, 12288, 6144), "smollm2-135m": (576, 1536, 960)}  # hidden, intermediate, q/k/v rows
EPS = 1e-6


def _weights(n: int, k: int, copies: int) -> list[torch.Tensor]:
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]


def run(shape: str, rounds: int) -> dict:
    hidden, inter, qkv_rows = SHAPES[shape]
    # one "layer" = the two weights of a half; enough layers that a round streams >= 512 MB (10x the L2)
    mlp_bytes = (hidden * hidden + 2 * inter * hidden) * 2
    attn_bytes = (hidden * inter + qkv_rows * hidden) * 2
    layers = max(2, min(512, -(-512_000_000 // min(mlp_bytes, attn_bytes))))
    w_o, w_gu = _weights(hidden, hidden, layers), _weights(2 * inter, hidden, layers)
    w_down, w_qkv = _weights(hidden, inter, layers), _weights(qkv_rows, hidden, layers)
    nw = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    a = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)  # attention output
    m = torch.randn(1, inter, device="cuda", dtype=torch.bfloat16)  # SiLU-mul output
    s = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)  # the residual stream

    def sequence(x, firsts, seconds, folded: bool, swiglu: bool):
        """The half over every layer's weights: x W1 (+ the stream), then the second projection of the
        normed stream (default: the add + RMSNorm kernel between) or of the raw stream (folded)."""
        def second(y, w2):
            if swiglu:
                return gemv_swiglu(y, w2, rows=(y, EPS)) if folded else gemv_swiglu(y, w2)
            return gemv(y, w2)

        def run():
            for w1, w2 in zip(firsts, seconds):
                if folded:
                    gemv(x, w1, add_into=s)
                    second(s, w2)
                else:
                    second(rmsnorm(gemv(x, w1), nw, EPS, residual=s)[0], w2)
        return run

    out: dict = {"shape": shape, "layers_per_round": layers, "mlp_mb": mlp_bytes / 1e6, "attn_mb": attn_bytes / 1e6}
    cases = {"mlp_default": (sequence(a, w_o, w_gu, False, True), mlp_bytes),
             "mlp_folded": (sequence(a, w_o, w_gu, True, True), mlp_bytes),
             "attn_default": (sequence(m, w_down, w_qkv, False, False), attn_bytes),
             "attn_folded": (sequence(m, w_down, w_qkv, True, False), attn_bytes)}
    for name in cases:
        out[name] = []
    for _ in range(rounds):  # interleaved: default, folded, default, folded ...
        for name, (fn, nbytes) in cases.items():
            s.normal_()
            t = bench(fn) / layers
            out[name].append(t * 1e6)
    bw = copy_bandwidth()
    out["copy_bandwidth_gb_s"] = bw / 1e9
    for half in ("mlp", "attn"):
        nbytes = cases[f"{half}_default"][1]
        d, f = min(out[f"{half}_default"]), min(out[f"{half}_folded"])
        out[f"{half}_summary"] = {"default_us": d, "folded_us": f, "folded_minus_default_us": f - d,
                                  "roofline_us": nbytes / bw * 1e6}
        print(f"{shape} {half} half: default {d:.2f} us, folded {f:.2f} us ({f - d:+.2f} us a layer), "
              f"bytes at the copy bandwidth {nbytes / bw * 1e6:.2f} us", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), action="append", help="repeatable; default: qwen3-8b and smollm2-135m")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the four sequences (the minimum is reported)")
    p.add_argument("--out", default="bench/results/folded_pieces.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    res = {"gpu": torch.cuda.get_device_name(), "results": [run(sh, args.rounds) for sh in (args.shape or ["qwen3-8b", "smollm2-135m"])]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
