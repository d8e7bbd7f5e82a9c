"""kernels/quant/split_k.py under TRITON_INTERPRET=1 (in a subprocess): each dp4a kernel's split over K finished
by the tile's last program gives the same bits as the split-sum launch (the partials are added in the same
order), leaves the counters at zero, and gives the same bits again on the same counters; without counters a
zeroed set is made per call."""

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import dataclasses, json, torch
from treeflash.kernels.quant import quant_matmul
from treeflash.kernels.quant.config import Dp4aConfig, QuantTuning
from treeflash.kernels.quant.split_k import tile_counters
from treeflash.kernels.quant.synthetic import random_blocks
g = torch.Generator().manual_seed(3)
split = Dp4aConfig(block_n=16, min_programs=8)
cases = {"Q4_K": ("q4k_dp4a", {}), "Q4_K lanes": ("q4k_lanes", {"q4k_gemv_route": "lanes"}), "Q6_K": ("q6k_dp4a", {}), "Q6_K lanes": ("q6k_lanes", {"q6k_gemv_route": "lanes"}),
         "Q8_0": ("q8_0_dp4a", {}), "Q3_K": ("q3k_dp4a", {})}
out = {}
for name, (field, routes) in cases.items():
    fmt = name.split()[0]
    n, k = 40, 1024
    blocks = random_blocks(fmt, n, k, g)
    x = torch.randn(1, k, generator=g)
    cfg = dataclasses.replace(split, block_n=8, min_programs=16) if "lanes" in name else split
    plain = QuantTuning(**routes, **{field: cfg})
    fused = QuantTuning(**routes, **{field: dataclasses.replace(cfg, fused_split=True)})
    counters = tile_counters(n, "cpu")
    y0 = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=plain)
    y1 = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=fused, counters=counters)
    left = int(counters.abs().sum())
    y2 = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=fused, counters=counters)
    y3 = quant_matmul(x, blocks, fmt, k, out_dtype=torch.float32, tuning=fused)
    out[name] = dict(same=torch.equal(y0, y1), again=torch.equal(y1, y2), fresh=torch.equal(y1, y3), left=left,
                     nonzero=bool(y0.abs().max() > 0))
print(json.dumps(out))
"""


def test_fused_split_equals_the_split_sum_launch_bitwise():
    res = run_interpreted(CHECK, timeout=900)
    assert sorted(res) == sorted(["Q4_K", "Q4_K lanes", "Q6_K", "Q6_K lanes", "Q8_0", "Q3_K"]), res
    for name, v in res.items():
        assert v == dict(same=True, again=True, fresh=True, left=0, nonzero=True), (name, v)


def test_split_buffers_without_counters_makes_zeroed_ones():
    import torch

    from treeflash.kernels.quant.split_k import split_buffers, tile_counters

    out = torch.empty(1, 40)
    part, cnt = split_buffers(40, 4, 3, out, None)
    assert part.shape == (4, 40) and cnt.dtype == torch.int32 and cnt.numel() == 3 and int(cnt.sum()) == 0
    kept = tile_counters(40, "cpu")  # cdiv(40, 4) = 10: tiles of >= 4 rows
    assert split_buffers(40, 4, 10, out, kept)[1] is kept
    assert split_buffers(40, 4, 20, out, kept)[1] is not kept  # tiles of 2 rows: more than the kept counters cover
    assert split_buffers(40, 1, 3, out, kept) == (out, out)
