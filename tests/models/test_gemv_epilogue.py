"""Decode steps through gemv with the residual add + RMSNorm as its epilogue equal plain torch
(a tiny hybrid model, fp32, the Triton interpreter on the CPU)."""

from tests.kernels.interpret import run_module


def test_decode_with_norm_epilogue_matches_plain_torch():
    r = run_module("tests.models.gemv_model_checks")
    # 4 layers: each mixer's out/o_proj and each down_proj defers to the next norm (the last to the final norm)
    assert r["epilogue_calls"] == 5 * 8 and r["epilogue_calls_plain"] == 0, r
    assert r["gemv_err"] <= 1e-5 * max(r["scale"], 1.0), r
    assert r["epilogue_err"] <= 1e-5 * max(r["scale"], 1.0), r


def test_decode_with_norm_prologue_matches_plain_torch():
    """gemv.NORM_PROLOGUE: each layer's two norms run inside the fused input projection after them
    (qkv or the Gated DeltaNet in_proj, and gate_up), 5 decode steps of the tiny hybrid model; the
    first layer's input norm has no residual to add yet and runs alone."""
    r = run_module("tests.models.gemv_model_checks", "prologue")
    assert r["prologue_calls"] == 5 * (2 * r["layers"] - 1) and r["prologue_calls_plain"] == 0, r
    assert r["gemv_err"] <= 1e-5 * max(r["scale"], 1.0), r
    assert r["prologue_err"] <= 1e-5 * max(r["scale"], 1.0), r
    # qkv / in_proj only (NORM_PROLOGUE_SWIGLU off): the input norms of layers 1-3
    assert r["qkv_only_calls"] == 5 * (r["layers"] - 1) and r["qkv_only_err"] <= 1e-5 * max(r["scale"], 1.0), r


def test_verify_step_with_gemv_rows_matches_plain_torch():
    """gemv.ROWS_MAX: a 5-token step's projections run on the GEMVs, one program column per row."""
    r = run_module("tests.models.gemv_model_checks", "rows")
    assert r["multi_row_calls"] > 0 and r["multi_row_calls"] == r["calls"], r
    assert r["rows_err"] <= 1e-5 * max(r["scale"], 1.0), r


def test_folded_decode_matches_transformers():
    """models.transformer's folded decode (TREEFLASH_FOLDED_DECODE): one-token steps through forward_folded,
    every projection on the GEMVs with the residual adds in their epilogues and no norm kernel, equal to
    transformers in fp32 (llama; qwen3 with its q/k norms). The weights are folded in place, so the 10-token
    prefill runs folded too; unfolding again is refused."""
    r = run_module("tests.models.gemv_model_checks", "folded_decode")
    for arch, row in r.items():
        # 5 steps x layers: o_proj and down add into the stream; gate_up scales by 1 / rms
        assert row["add_calls"] == 5 * 2 * row["layers"] and row["rows_calls"] == 5 * row["layers"], (arch, row)
        assert row["err"] <= 5e-6 * max(row["scale"], 1.0), (arch, row)  # measured 2-4e-7
        assert row["unfold_refused"], (arch, row)
