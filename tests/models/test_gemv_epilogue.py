"""Decode steps through gemv (plain and folded) equal plain torch / transformers (tiny models, fp32,
the Triton interpreter on the CPU)."""

from tests.kernels.interpret import run_module


def test_decode_on_gemv_matches_plain_torch():
    r = run_module("tests.models.gemv_model_checks")
    # 4 layers x 5 steps: each mixer's out/o_proj and each down_proj on gemv; none before the shapes were tuned
    assert r["gemv_calls"] == 5 * 8 and r["gemv_calls_ref"] == 0, r
    assert r["gemv_err"] <= 1e-5 * max(r["scale"], 1.0), r


def test_folded_decode_matches_transformers():
    """models.transformer's folded decode (fuse_projections(folded_decode=True)): one-token steps through forward_folded,
    every projection on the GEMVs with the residual adds in their epilogues and no norm kernel, equal to
    transformers in fp32 (llama; qwen3 with its q/k norms). The weights are folded in place, so the 10-token
    prefill runs folded too; unfolding again is refused."""
    r = run_module("tests.models.gemv_model_checks", "folded_decode")
    for arch, row in r.items():
        # 5 steps x layers: o_proj and down add into the stream; gate_up scales by 1 / rms
        assert row["add_calls"] == 5 * 2 * row["layers"] and row["rows_calls"] == 5 * row["layers"], (arch, row)
        assert row["err"] <= 5e-6 * max(row["scale"], 1.0), (arch, row)  # measured 2-4e-7
        assert row["unfold_refused"], (arch, row)
