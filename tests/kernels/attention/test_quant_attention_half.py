"""The fp16 dequantization schemes of the compressed-cache attention ("half" and "words", the
words_* / halfk_* launch variants): q8_0 and q4_0 blocks become exact fp16 integers (the code under
1024's exponent, one fp16 subtract), times the block scale in fp16, and both dots run in fp16 for a
16-bit query. Checked under TRITON_INTERPRET=1, where the shift-based unpacking stands in for the
inline PTX (the same integers), against dequantize + SDPA in fp32 with the dequantized values rounded
to fp16 as the kernel rounds them; what is left is p's fp16 rounding and the output's.

Also: an fp32 query, or a dense side, falls back to "flat" (the fp32 path, exact to 1e-5 elsewhere).
The inline PTX itself runs only on a GPU: bench/kv_attention_gpu.py checks every variant there."""

from __future__ import annotations

import json

import pytest

from tests.kernels.interpret import assert_all_passed, run_module

TREE = [-1, 0, 0, 1, 2, 2, 4]
PAIRS = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("q4_0", "tq3_0"), ("tq3_0", "q8_0"), ("tq3_0", "tq3_0")]
# max |error| / max |reference|: p's fp16 rounding, the output's rounding (fp16 2^-11, bf16 2^-8 relative);
# a wrong unpacking order or scale is off by tens of percent
REL_TOL = {"float16": 3e-3, "bfloat16": 8e-3}


def _cases() -> dict[str, tuple]:
    cases = {}
    variants = ("words_n32_w4", "halfk_wordsv_n32_w4", "words_n64_w8")
    for i, (a, b) in enumerate(PAIRS):
        for j, variant in enumerate(variants):
            mode = ("decode", "verify", "masked_verify")[(i + j) % 3]
            dtype = ("float16", "bfloat16")[(i + j) % 2]
            cases[f"{variant}_{mode}_{a}_{b}_{dtype}"] = (variant, a, b, mode, dtype)
    return cases


def _half_planes(p):
    """The planes with every value rounded as the kernel rounds it: code * scale to fp16."""
    from treeflash.kernels.kv import kv_formats as formats
    from treeflash.kernels.kv.kv_quant import Planes

    if p.scales is None or p.name == "tq3_0":
        return p
    return Planes("bf16", None, formats.dequantize(p.name, p.scales, p.codes).to(torch_dtype("float16")).float().contiguous())


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def check(variant: str, fmt_k: str, fmt_v: str, mode: str, dtype: str) -> None:
    import torch

    from tests.kernels.interpret_checks import _planes, _tree_mask
    from treeflash.kernels.attention import quant_attention as qa
    from treeflash.kernels.attention.attention_launch import variant_config

    heads, kv_heads, d = 6, 2, 64
    num_new = 1 if mode == "decode" else len(TREE)
    start, splits = 133, 3
    length = start + num_new + 5
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    q = torch.randn(num_new, heads, d).to(torch_dtype(dtype))
    config = variant_config(variant, d, num_new * heads // kv_heads)
    qr = q.to(torch.float16).float()  # the kernel's fp16 query
    kr, vr = _half_planes(k), _half_planes(v)
    if mode.startswith("masked"):
        key_mask = torch.rand(num_new, length) < 0.6
        key_mask[:, 0] = True
        out = qa.quant_attention_masked(q, k, v, key_mask, d**-0.5, num_splits=splits, config=config)
        ref = qa.quant_attention_masked_reference(qr, kr, vr, key_mask, d**-0.5)
    else:
        mask = None if num_new == 1 else _tree_mask(TREE)
        out = qa.quant_attention(q, k, v, start, mask, d**-0.5, num_splits=splits, config=config)
        ref = qa.quant_attention_reference(qr, kr, vr, start, mask, d**-0.5)
    assert out.dtype == q.dtype
    rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert rel < REL_TOL[dtype], f"max relative error {rel:.3g}"


def check_fp32_falls_back(variant: str) -> None:
    """An fp32 query runs the fp32 path under an fp16 variant: exact to 1e-5 like every other."""
    import torch

    from tests.kernels.interpret_checks import _planes
    from treeflash.kernels.attention import quant_attention as qa
    from treeflash.kernels.attention.attention_launch import variant_config

    k = _planes("q8_0", torch.randn(70, 2, 64))
    v = _planes("q4_0", torch.randn(70, 2, 64))
    q = torch.randn(1, 6, 64)
    out = qa.quant_attention(q, k, v, 69, None, 0.125, num_splits=2, config=variant_config(variant, 64, 3))
    ref = qa.quant_attention_reference(q, k, v, 69, None, 0.125)
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"


def main() -> None:
    from tests.kernels.interpret_checks import run_checks

    checks = {name: (check, args) for name, args in _cases().items()}
    checks["fp32_falls_back_words"] = (check_fp32_falls_back, ("words_n32_w4",))
    print(json.dumps(run_checks(checks)))


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    pytest.importorskip("triton")
    return run_module("tests.kernels.attention.test_quant_attention_half")


def test_fp16_schemes_match_the_reference(results):
    assert_all_passed(results, len(_cases()) + 1)


def test_schemes_pick_the_fp32_path_for_fp32_or_dense():
    import torch

    from treeflash.kernels.attention.attention_launch import variant_config
    from treeflash.kernels.attention.attention_launch import FMT_IDS, _schemes

    cfg = variant_config("halfk_wordsv_n32_w4", 256, 6)
    q8, tq3 = FMT_IDS["q8_0"], FMT_IDS["tq3_0"]
    assert _schemes(cfg, q8, q8, torch.bfloat16) == ("half", "words")
    assert _schemes(cfg, q8, tq3, torch.float16) == ("half", "words")
    assert _schemes(variant_config("words_n32_w4", 256, 6), tq3, tq3, torch.bfloat16) == ("words", "words")
    assert _schemes(variant_config("words_n32_w4", 256, 6), tq3, tq3, torch.float32) == ("blocks_fast", "blocks_fast")
    assert _schemes(cfg, tq3, q8, torch.float32) == ("blocks_fast", "flat")
    assert _schemes(cfg, q8, q8, torch.float32) == ("flat", "flat")
    assert _schemes(cfg, 0, q8, torch.bfloat16) == ("flat", "flat")


if __name__ == "__main__":
    main()
