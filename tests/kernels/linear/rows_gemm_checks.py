"""rows_gemm (kernels/linear/rows_gemm.py) under TRITON_INTERPRET=1, run in a subprocess by
tests/kernels/linear/test_rows_gemm.py. Prints one JSON line: name -> {"err": max |y - reference|,
"scale": max |reference|} for the accuracy cases, and name -> {"same": bool, "split": the split launched}
for the invariance cases (every row of rows_gemm(x) bitwise equal whether computed alone or among others)."""

from __future__ import annotations

import json

import torch

N = 100  # a ragged tail of BLOCK_N 64 (and 32)
# (name, K, RowsGemmConfig fields): K tiles of 32 with no split, a split of 3 over a ragged K (the last split
# partly masked), a split of 2 over an even K, and the shape's own config (default_config)
CONFIGS = (("nosplit", 96, dict(block_n=64, block_k=32, split=1)),
           ("split3_ragged", 200, dict(block_n=32, block_k=32, split=3)),
           ("split2", 256, dict(block_n=64, block_k=64, split=2)),
           ("default", 192, None))
MS = (1, 2, 5, 16, 17, 33)
DTYPES = ("float16", "float32", "bfloat16")  # bf16 as fp32 dots under the interpreter (its bf16 dot is wrong)


def case_names() -> list[str]:
    acc = [f"acc_{c}_m{m}_{dt}" for c, _, _ in CONFIGS for m in MS for dt in DTYPES]
    epi = [f"epi_{c}_{dt}" for c, _, _ in CONFIGS for dt in DTYPES]
    inv = [f"inv_{c}_{dt}" for c, _, _ in CONFIGS for dt in ("float16", "float32")]
    return acc + epi + inv


def main() -> None:
    from treeflash.kernels.linear.rows_gemm import RowsGemmConfig, rows_gemm, rows_gemm_config, rows_gemm_reference

    gen = torch.Generator().manual_seed(0)
    out = {}

    def err(y, ref):
        return {"err": (y.float() - ref.float()).abs().max().item(), "scale": ref.float().abs().max().item(),
                "dtype": str(y.dtype).removeprefix("torch.")}

    for name, k, fields in CONFIGS:
        cfg = RowsGemmConfig(**fields) if fields else rows_gemm_config(N, k)
        for dt_name in DTYPES:
            dt = getattr(torch, dt_name)
            w = (torch.randn(N, k, generator=gen) / k**0.5).to(dt)
            for m in MS:
                x = torch.randn(m, k, generator=gen).to(dt)
                y = rows_gemm(x, w, config=cfg)
                assert y.shape == (m, N) and y.dtype == dt
                out[f"acc_{name}_m{m}_{dt_name}"] = err(y, rows_gemm_reference(x, w))
            # bias and the in-place residual add, 17 rows (two m-blocks)
            x = torch.randn(17, k, generator=gen).to(dt)
            b = torch.randn(N, generator=gen).to(dt)
            r = torch.randn(17, N, generator=gen).to(dt)
            got = r.clone()
            back = rows_gemm(x, w, b, config=cfg, add_into=got)
            assert back is got
            out[f"epi_{name}_{dt_name}"] = err(got, rows_gemm_reference(x, w, b, r))
        for dt_name in ("float16", "float32"):
            dt = getattr(torch, dt_name)
            w = (torch.randn(N, k, generator=gen) / k**0.5).to(dt)
            x = torch.randn(33, k, generator=gen).to(dt)
            full = rows_gemm(x, w, config=cfg)
            same = all(torch.equal(rows_gemm(x[i:i + 1], w, config=cfg)[0], full[i]) for i in range(33))
            same = same and all(torch.equal(rows_gemm(x[:j], w, config=cfg), full[:j]) for j in (2, 5, 16, 17, 20, 32))
            same = same and torch.equal(rows_gemm(x[3:20], w, config=cfg), full[3:20])  # rows at other tile positions
            tiles = -(-(-(-k // cfg.split)) // cfg.block_k)
            out[f"inv_{name}_{dt_name}"] = {"same": bool(same), "split": -(-(-(-k // cfg.block_k)) // tiles)}
    assert sorted(out) == sorted(case_names())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
