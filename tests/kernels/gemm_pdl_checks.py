"""kernels/gemm_pdl.py against gemm_ref under TRITON_INTERPRET=1 (run by test_gemm_pdl.py).
Prints one JSON line: case -> None or the largest difference."""

from __future__ import annotations

import json

import torch


def main() -> None:
    from treeflash.kernels.gemm_pdl import gemm, gemm_ref

    torch.manual_seed(0)
    out = {}
    # SmolLM2's folded projections (q/k/v, o, gate/up, down) at a DDTree-48 verify's 49 rows, and odd sizes:
    # K not a multiple of BLOCK_K, N not a multiple of BLOCK_N, 2 rows, 65 rows (two m-blocks), fp32
    cases = [("qkv", 49, 960, 576, torch.bfloat16), ("o_add", 49, 576, 576, torch.bfloat16),
             ("gate_up", 33, 3072, 576, torch.bfloat16), ("down_add", 17, 576, 1536, torch.bfloat16),
             ("odd", 2, 40, 100, torch.bfloat16), ("two_blocks_add", 65, 48, 80, torch.bfloat16), ("fp32", 5, 24, 70, torch.float32)]
    for name, m, n, k, dtype in cases:
        x = torch.randn(m, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        if name.endswith("_add"):
            s = torch.randn(m, n).to(dtype)
            got, want = gemm(x, w, add_into=s.clone()), gemm_ref(x, w, add_into=s.clone())
        else:
            got, want = gemm(x, w), gemm_ref(x, w)
        # one rounding of an fp32 sum: the kernel's sum order differs from the reference's, so allow one
        # ulp of the output dtype, no more
        tol = (2**-7 if dtype == torch.bfloat16 else 1e-5) * want.float().abs().clamp_min(1.0)
        diff = (got.float() - want.float()).abs()
        ok = got.shape == want.shape and got.dtype == want.dtype and bool((diff <= tol).all())
        out[name] = None if ok else f"max diff {float(diff.max())}"
    # split K (q/k/v: 3 splits, down: 8) hands its tickets back: the same call again gives the same bits
    x, w = torch.randn(49, 576).to(torch.bfloat16), torch.randn(960, 576).to(torch.bfloat16)
    first = gemm(x, w)
    out["split_repeat"] = None if torch.equal(first, gemm(x, w)) and torch.equal(first, gemm(x, w)) else "differs"
    # a strided x (a column slice of a wider tensor) reads its rows by stride
    x = torch.randn(7, 96).to(torch.bfloat16)[:, :64]
    w = torch.randn(32, 64).to(torch.bfloat16)
    diff = (gemm(x, w).float() - gemm_ref(x, w).float()).abs().max()
    out["strided_x"] = None if float(diff) <= 2**-7 * float(gemm_ref(x, w).float().abs().max()) else f"max diff {float(diff)}"
    # the folded layers end to end, every kernel through the interpreter (this GEMM included): a tiny
    # llama's 23-token prefill against transformers (fp32), as tests/models/test_parity.py does with cuBLAS
    from tests.models.hf_oracle import make_pair
    from treeflash.models.step import StepInput

    hf, ours = make_pair("llama")
    ours.fuse_projections(folded_rows=64)
    ids = torch.randint(0, 97, (1, 23))
    with torch.inference_mode():
        ref = hf(ids).logits[0].float()
        got = ours(StepInput.plain(ids[0], 0), ours.new_cache(64)).logits
    err = float((got - ref).abs().max())
    out["folded_llama_prefill"] = None if err < 1e-4 else f"max abs {err}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
