"""Every launch variant of the compressed-cache attention (attention_launch.VARIANTS: dequantization
scheme x keys per step x warps x prefetch) equals dequantize + SDPA: decode and tree verify, both
entry points, every format pair, lengths that leave a masked tail (TRITON_INTERPRET=1).

Run by pytest through a subprocess (the interpreter must be switched on before triton is
imported); `python -m tests.kernels.attention.test_quant_attention_variants` prints the JSON of results."""

from __future__ import annotations

import json
import os

import pytest

from tests.kernels.interpret import assert_all_passed, run_module

FORMATS = ("bf16", "q8_0", "q4_0", "tq3_0")
TREE = [-1, 0, 0, 1, 2, 2, 4]  # siblings 1/2 and 4/5 must not see each other


def _cases() -> dict[str, tuple]:
    """name -> (variant, fmt_k, fmt_v, mode). Each variant sees every K/V pair once (decode or
    verify, alternating) plus both static-mode shapes, so no variant x pair is left out."""
    from treeflash.kernels.attention.attention_launch import VARIANTS

    pairs = [(a, b) for a in FORMATS for b in FORMATS if "bf16" != a or b != "bf16"]
    cases = {}
    for vi, name in enumerate(VARIANTS):
        for pi, (a, b) in enumerate(pairs):
            mode = "decode" if (vi + pi) % 2 else "verify"
            cases[f"{name}_{mode}_{a}_{b}"] = (name, a, b, mode)
        cases[f"{name}_masked_decode_tq3_0_q4_0"] = (name, "tq3_0", "q4_0", "masked_decode")
        cases[f"{name}_masked_verify_q8_0_tq3_0"] = (name, "q8_0", "tq3_0", "masked_verify")
    # more than 128 splits (the combine kernel's narrower chunks), 16 keys a step
    cases["flat_n32_w4_p4_splits_decode_q8_0_tq3_0"] = ("flat_n32_w4_p4", "q8_0", "tq3_0", "splits_decode")
    cases["fast_n32_w4_pf_p4_splits_decode_q4_0_bf16"] = ("fast_n32_w4_pf_p4", "q4_0", "bf16", "splits_decode")
    return cases


def check(variant: str, fmt_k: str, fmt_v: str, mode: str) -> None:
    import torch

    from tests.kernels.interpret_checks import _planes, _tree_mask
    from treeflash.kernels.attention import quant_attention as qa
    from treeflash.kernels.attention.attention_launch import variant_config

    heads, kv_heads, d = 6, 2, 64
    num_new = 1 if mode.endswith("decode") else len(TREE)
    start = 133  # with 64 keys a step: 2 full blocks and a masked tail; 3 splits, the last short
    splits = 3
    if mode.startswith("splits"):  # 200 blocks of 16 keys, one per split: 200 splits, the last short
        start, splits = 16 * 199 + 6, 200
    length = start + num_new + 5  # rows past start + T exist but must not be read
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    q = torch.randn(num_new, heads, d)
    config = variant_config(variant, d, num_new * heads // kv_heads)
    if mode.startswith("splits"):
        import dataclasses

        config = dataclasses.replace(config, block_n=16)
    if mode.startswith("masked"):
        key_mask = torch.rand(num_new, length) < 0.6
        key_mask[:, 0] = True
        out = qa.quant_attention_masked(q, k, v, key_mask, d**-0.5, num_splits=splits, config=config)
        ref = qa.quant_attention_masked_reference(q, k, v, key_mask, d**-0.5)
    else:
        mask = None if num_new == 1 else _tree_mask(TREE)
        out = qa.quant_attention(q, k, v, start, mask, d**-0.5, num_splits=splits, config=config)
        ref = qa.quant_attention_reference(q, k, v, start, mask, d**-0.5)
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"


def main() -> None:
    from tests.kernels.interpret_checks import run_checks

    print(json.dumps(run_checks({name: (check, args) for name, args in _cases().items()})))


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    pytest.importorskip("triton")
    return run_module("tests.kernels.attention.test_quant_attention_variants", timeout=900)


def test_every_variant_matches_the_reference(results):
    assert_all_passed(results, len(_cases()))


def test_launch_config_rejects_bad_values():
    pytest.importorskip("triton")
    from treeflash.kernels.attention.attention_launch import LaunchConfig, variant_config

    with pytest.raises(ValueError):
        LaunchConfig(16, 32, 4, 3, 2, dequant="nibbles")
    with pytest.raises(ValueError):
        LaunchConfig(16, 24, 4, 3, 2)
    with pytest.raises(ValueError):
        variant_config("no_such_variant", 256, 6)


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    main()
