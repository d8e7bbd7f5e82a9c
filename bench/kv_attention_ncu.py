"""One decode call of the compressed-cache attention, for Nsight Compute: the 27B attention shape
(24 query / 4 KV heads, head_dim 256), a K/V pair and a context, launch_config's default (or a
launch variant). Run it under ncu, e.g.

    ncu --clock-control none --kernel-name regex:_partial_kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \\
        python3 bench/kv_attention_ncu.py --pair q8_0/q8_0 --context 131072
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.kv_attention_gpu import make_planes  # noqa: E402
from treeflash.kernels import attention_launch as launch  # noqa: E402
from treeflash.kernels import quant_attention as qa  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="q8_0/q8_0", help="K/V types")
    p.add_argument("--context", type=int, default=131072)
    p.add_argument("--variant", default=None, choices=list(launch.VARIANTS), help="a launch variant (default: launch_config's)")
    p.add_argument("--calls", type=int, default=3, help="decode calls (the first compiles)")
    args = p.parse_args()
    kt, vt = args.pair.split("/")
    k = make_planes(kt, args.context, 4, 256)
    v = make_planes(vt, args.context, 4, 256)
    q = torch.randn(1, 24, 256, device="cuda", dtype=torch.bfloat16)
    cfg = launch.variant_config(args.variant, 256, 6) if args.variant else None
    for _ in range(args.calls):
        qa.quant_attention(q, k, v, args.context - 1, None, 256**-0.5, config=cfg)
    torch.cuda.synchronize()
    print(f"{args.pair} at {args.context}: {args.calls} decode calls", flush=True)


if __name__ == "__main__":
    main()
