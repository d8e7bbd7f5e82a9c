"""The "split" dequantization with q8_0 sides split too (LaunchConfig.split_q8, the split8_* launch
variants; kernels/attention/kv_split.py): a q8_0 row's int32 words (four codes each) become four fp16 parts
[N, D/4], part j holding byte j of each word (channel 4c + j), dequantized in the load's layout and dotted
with the query's (or stored to the output's) matching channels. Plain "split" keeps q8_0 on "words".

Checked under TRITON_INTERPRET=1 (in a subprocess, the shift-based unpacking standing in for the "words"
PTX) with test_quant_attention_split's check: against dequantize + SDPA in fp32 with every value rounded
as the kernel rounds it (code x scale to fp16: the numerics of "words") and the query rounded to fp16;
decode, tree verify and the static masked entry point, head_dim 256 and 128 (64 once: K alone splits),
fp16 and bf16 queries, the same tolerances. Each case asserts which sides run "split"."""

from __future__ import annotations

import json

import pytest

from tests.kernels.interpret import assert_all_passed, run_module

PAIRS = [("q8_0", "q8_0"), ("q8_0", "tq3_0"), ("tq3_0", "q8_0"), ("q8_0", "q4_0"), ("q8_0", "bf16")]


def _cases() -> dict[str, tuple]:
    """name -> (variant, fmt_k, fmt_v, mode, dtype, head_dim): every pair in every mode at head_dim 256,
    one mode per pair at 128; split8_n32_w8 and head_dim 64 once (there V runs "words")."""
    cases = {}
    modes = ("decode", "verify", "masked_verify")
    for i, (a, b) in enumerate(PAIRS):
        for j, mode in enumerate(modes):
            dtype = ("float16", "bfloat16")[(i + j) % 2]
            variant = ("split8_n32_w4", "split8_n32_w4", "split8_n64_w4")[(i + j) % 3]
            cases[f"{variant}_{mode}_{a}_{b}_{dtype}_d256"] = (variant, a, b, mode, dtype, 256)
        mode, dtype = ("decode", "verify", "masked_decode")[i % 3], ("float16", "bfloat16")[i % 2]
        cases[f"split8_n64_w4_{mode}_{a}_{b}_{dtype}_d128"] = ("split8_n64_w4", a, b, mode, dtype, 128)
    cases["split8_n32_w8_verify_q8_0_q8_0_float16_d256"] = ("split8_n32_w8", "q8_0", "q8_0", "verify", "float16", 256)
    cases["split8_n32_w4_decode_q8_0_q8_0_bfloat16_d64"] = ("split8_n32_w4", "q8_0", "q8_0", "decode", "bfloat16", 64)
    return cases


def main() -> None:
    from tests.kernels.interpret_checks import run_checks
    from tests.kernels.attention.test_quant_attention_split import _patch_interpreter_bf16_dot, check

    _patch_interpreter_bf16_dot()  # Triton 3.6's interpreter: bf16 dots from raw bits (see there)
    print(json.dumps(run_checks({name: (check, args) for name, args in _cases().items()})))


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    pytest.importorskip("triton")
    return run_module("tests.kernels.attention.test_quant_attention_split8")


def test_split8_matches_the_reference(results):
    assert_all_passed(results, len(_cases()))


def test_schemes_split_q8_0_only_under_split8():
    import torch

    pytest.importorskip("triton")
    from treeflash.kernels.attention.attention_launch import FMT_IDS, LaunchConfig, _dot_dtypes, _schemes, launch_config, variant_config

    q8, q4, tq3 = FMT_IDS["q8_0"], FMT_IDS["q4_0"], FMT_IDS["tq3_0"]
    s4, s8w4, s8w8 = (variant_config(n, 256, 6) for n in ("split_n32_w4", "split8_n32_w4", "split8_n32_w8"))
    assert _schemes(s4, q8, q8, torch.float16, 256) == ("words", "words")  # plain split: q8_0 stays on words
    assert _schemes(s8w4, q8, q8, torch.float16, 256) == ("split", "split")
    assert _schemes(s8w4, q8, tq3, torch.bfloat16, 256) == ("split", "split")
    assert _schemes(s8w4, tq3, q8, torch.bfloat16, 256) == ("split", "split")
    assert _schemes(s8w4, q8, q4, torch.float16, 256) == ("split", "split")
    assert _schemes(s8w4, q8, 0, torch.bfloat16, 256) == ("split", "flat")  # beside a dense V
    assert _dot_dtypes("split", "flat", torch.bfloat16) == (torch.float16, torch.bfloat16)
    assert _schemes(s8w4, q8, q8, torch.float32, 256) == ("flat", "flat")  # fp32 query: the fp32 path
    # width rules as for q4_0 (D/4): K parts >= 16, V parts >= 8 x warps
    assert _schemes(s8w4, q8, q8, torch.float16, 128) == ("split", "split")
    assert _schemes(s8w4, q8, q8, torch.float16, 64) == ("split", "words")
    assert _schemes(s8w8, q8, q8, torch.float16, 256) == ("split", "split")
    assert _schemes(s8w8, q8, q8, torch.float16, 128) == ("split", "words")
    # without formats, the defaults do not split q8_0
    for rows, tq3_side in ((6, False), (6, True), (96, False)):
        cfg = launch_config(256, rows, compressed_kv=True, tq3_side=tq3_side)
        assert not cfg.split_q8 and _schemes(cfg, q8, q8, torch.bfloat16, 256)[0] == "words"
    # with them, decode splits q8_0 K where the H200 measured it faster (bench/results/kv_attention_sweep_split*.json)
    def default(head_dim, rows, k, v):
        return launch_config(head_dim, rows, compressed_kv=True, tq3_side="tq3_0" in (k, v), formats=(k, v))

    assert default(256, 6, "q8_0", "q8_0") == variant_config("split8_n32_w4", 256, 6)
    assert default(256, 6, "q8_0", "tq3_0") == variant_config("split8_n32_w4", 256, 6)
    assert default(128, 4, "q8_0", "q8_0") == variant_config("split8_n64_w4", 128, 4)
    assert not default(256, 6, "q8_0", "q4_0").split_q8  # slower there: split on the q4_0 side only
    assert not default(256, 96, "q8_0", "q8_0").split_q8  # verify: not timed
    # q4_0/q4_0 and tq3_0/tq3_0 decode at head_dim 256: 64 keys a step (bench/results/kv_attention_sweep_64k.json)
    assert default(256, 6, "q4_0", "q4_0") == variant_config("split_n64_w4", 256, 6)
    assert default(256, 6, "tq3_0", "tq3_0") == variant_config("split_n64_w4", 256, 6)
    assert default(256, 6, "q4_0", "tq3_0").block_n == 32  # mixed: not timed
    assert default(256, 96, "q4_0", "q4_0").block_n == 32  # verify: unchanged
    assert default(128, 4, "tq3_0", "tq3_0") == launch_config(128, 4, compressed_kv=True, tq3_side=True)  # other head_dims: unchanged
    assert not default(128, 4, "q8_0", "tq3_0").split_q8 and not default(64, 4, "q8_0", "q8_0").split_q8
    with pytest.raises(ValueError, match="split_q8"):
        LaunchConfig(16, 32, 4, 3, 2, dequant="words", split_q8=True)


if __name__ == "__main__":
    main()
