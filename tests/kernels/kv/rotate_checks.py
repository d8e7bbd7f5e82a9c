"""kernels/kv/rotate.py against its reference under TRITON_INTERPRET=1 (run by test_rotate.py).
Prints one JSON line: case -> None (passed) or what failed."""

from __future__ import annotations

import json

import torch


def main() -> None:
    from treeflash.kernels.kv.rotate import rotate_rows, rotate_rows_reference

    torch.manual_seed(0)
    out = {}
    # (name, tokens, heads, head_dim, input dtype, output dtype, offset, inverse, strided): head_dim 64 (one group of
    # 64), 128, 256 (two groups of 128); a query as a strided view of a fused qkv row; rows not a multiple of ROWS
    cases = [
        ("q_d64_bf16_to_fp16", 3, 9, 64, torch.bfloat16, torch.float16, False, False, False),
        ("q_d256_strided_bf16_to_fp16", 1, 24, 256, torch.bfloat16, torch.float16, False, False, True),
        ("k_d256_centered_fp32", 5, 4, 256, torch.bfloat16, torch.float32, True, False, False),
        ("k_d128_centered_strided", 7, 2, 128, torch.float16, torch.float32, True, False, True),
        ("out_d256_inverse_to_bf16", 2, 24, 256, torch.float32, torch.bfloat16, False, True, False),
        ("out_d64_inverse_fp32", 17, 3, 64, torch.float32, torch.float32, False, True, False),
    ]
    for name, n, h, d, din, dout, has_off, inverse, strided in cases:
        try:
            if strided:  # columns [0, h * d) of a wider row, as q sits in the fused qkv projection's output
                x = torch.randn(n, (h + 3) * d).to(din)[:, : h * d].view(n, h, d)
            else:
                x = torch.randn(n, h, d).to(din)
            off = torch.randn(h, d) if has_off else None
            got = rotate_rows(x, dout, off, inverse)
            want = rotate_rows_reference(x, dout, off, inverse)
            assert got.dtype == dout and got.shape == (n, h, d) and got.is_contiguous()
            tol = 1e-5 if dout == torch.float32 else 0.0
            err = (got.float() - want.float()).abs().max().item()
            # fp32: the same sums to rounding; 16-bit outputs: one rounding of nearly equal fp32 values, so at
            # most one unit in the last place apart
            ulp = 2.0 ** -10 if dout == torch.float16 else 2.0 ** -7
            bound = tol * want.abs().max().item() if dout == torch.float32 else ulp * want.abs().max().item()
            assert err <= bound, f"max abs error {err:.3g} > {bound:.3g}"
            # orthonormal: the norm of every row is kept (the offset taken off first)
            ref_norm = (x.float() - (off if off is not None else 0)).norm(dim=-1)
            assert torch.allclose(got.float().norm(dim=-1), ref_norm, rtol=1e-2 if dout != torch.float32 else 1e-5)
            out[name] = None
        except Exception as e:  # noqa: BLE001 - reported by the test
            out[name] = f"{type(e).__name__}: {e}"
    # a round trip: un-rotating the rotation gives the row back
    x = torch.randn(4, 3, 256)
    back = rotate_rows(rotate_rows(x, torch.float32), torch.float32, inverse=True)
    out["round_trip_d256"] = None if torch.allclose(back, x, atol=1e-5) else f"round trip off by {(back - x).abs().max():.3g}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
