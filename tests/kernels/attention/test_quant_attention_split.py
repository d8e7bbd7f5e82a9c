"""The "split" dequantization of the compressed-cache attention (kernels/attention/kv_split.py; the split_*
launch variants): q4_0 and tq3_0 rows become fp16 parts ([N, D/4] or [N, D/8]) in the load's layout,
each dotted with the query's (or stored to the output's) matching channels, with no join or reshape of
the codes. A q8_0 side in the same launch runs "words"; a dense side keeps its own type.

Checked under TRITON_INTERPRET=1 (in a subprocess, where the shift-based unpacking stands in for the
inline PTX) against dequantize + SDPA in fp32 with every value rounded as the kernel rounds it
(kv_split.split_planes_reference) and the query rounded to fp16: decode, tree verify and the static
masked entry point, head_dim 64 / 128 / 256, fp16 and bf16 queries. What is left is p's 16-bit
rounding and the output's. Each case also asserts which sides run "split" (attention_launch._schemes).

The inline PTX of tq3_0 runs only on a GPU (bench/kv_attention_gpu.py checks every variant there);
here its bit logic is run through a small PTX emulator against the same unpacking."""

from __future__ import annotations

import json
import random
import re
import struct

import pytest

from tests.kernels.interpret import assert_all_passed, run_module

TREE = [-1, 0, 0, 1, 2, 2, 4]
PAIRS = [("tq3_0", "tq3_0"), ("q4_0", "q4_0"), ("q8_0", "tq3_0"), ("tq3_0", "q8_0"), ("q4_0", "bf16"), ("bf16", "tq3_0")]
# max |error| / max |reference|: p's 16-bit rounding and the output's (fp16 2^-11, bf16 2^-8 relative);
# a wrong shift, part order or column map is off by tens of percent
REL_TOL = {"float16": 3e-3, "bfloat16": 8e-3}


def _cases() -> dict[str, tuple]:
    """name -> (variant, fmt_k, fmt_v, mode, dtype, head_dim). head_dim 256: every pair in every mode;
    64 and 128: one mode per pair (there only some sides fit "split": attention_launch.split_fits)."""
    cases = {}
    modes = ("decode", "verify", "masked_verify")
    for i, (a, b) in enumerate(PAIRS):
        for j, mode in enumerate(modes):
            dtype = ("float16", "bfloat16")[(i + j) % 2]
            variant = ("split_n32_w4", "split_n32_w4", "split_n64_w4")[(i + j) % 3]
            cases[f"{variant}_{mode}_{a}_{b}_{dtype}_d256"] = (variant, a, b, mode, dtype, 256)
        mode, dtype = modes[i % 3], ("bfloat16", "float16")[i % 2]
        cases[f"split_n32_w4_{mode}_{a}_{b}_{dtype}_d64"] = ("split_n32_w4", a, b, mode, dtype, 64)
    for a, b, mode in (("tq3_0", "tq3_0", "verify"), ("q4_0", "q4_0", "decode"), ("q8_0", "q4_0", "masked_decode")):
        cases[f"split_n32_w4_{mode}_{a}_{b}_bfloat16_d128"] = ("split_n32_w4", a, b, mode, "bfloat16", 128)
    cases["split_n32_w8_decode_q4_0_tq3_0_float16_d256"] = ("split_n32_w8", "q4_0", "tq3_0", "decode", "float16", 256)
    # the decode default of q4_0/q4_0 and tq3_0/tq3_0 at head_dim 256 (attention_launch.launch_config)
    cases["split_n64_w4_decode_tq3_0_tq3_0_bfloat16_d256"] = ("split_n64_w4", "tq3_0", "tq3_0", "decode", "bfloat16", 256)
    cases["split_n64_w4_decode_q4_0_q4_0_float16_d256"] = ("split_n64_w4", "q4_0", "q4_0", "decode", "float16", 256)
    return cases


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def check(variant: str, fmt_k: str, fmt_v: str, mode: str, dtype: str, d: int) -> None:
    import torch

    from tests.kernels.interpret_checks import _planes, _tree_mask
    from treeflash.kernels.attention import quant_attention as qa
    from treeflash.kernels.attention.attention_launch import FMT_IDS, _schemes, split_fits, variant_config
    from treeflash.kernels.attention.kv_split import split_planes_reference

    heads, kv_heads = 6, 2
    num_new = 1 if mode.endswith("decode") else len(TREE)
    start, splits = 133, 3
    length = start + num_new + 5
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    q = torch.randn(num_new, heads, d).to(torch_dtype(dtype))
    config = variant_config(variant, d, num_new * heads // kv_heads)
    fk, fv = FMT_IDS.get(fmt_k, 0), FMT_IDS.get(fmt_v, 0)
    want = tuple("split" if split_fits(f, d, config.num_warps, side, config.split_q8) else None for f, side in ((fk, "k"), (fv, "v")))
    got = tuple(x if x == "split" else None for x in _schemes(config, fk, fv, q.dtype, d))
    assert got == want, f"sides running split: {got}, expected {want}"
    qr = q.to(torch.float16).float()  # the kernel's fp16 query (a dense K with a bf16 query: exact either way)
    kr, vr = split_planes_reference(k), split_planes_reference(v)
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


def check_fp32_falls_back() -> None:
    """An fp32 query under a split variant runs the fp32 path (blocks_fast / flat): exact to 1e-5."""
    import torch

    from tests.kernels.interpret_checks import _planes
    from treeflash.kernels.attention import quant_attention as qa
    from treeflash.kernels.attention.attention_launch import variant_config

    k = _planes("tq3_0", torch.randn(70, 2, 256))
    v = _planes("q4_0", torch.randn(70, 2, 256))
    q = torch.randn(1, 6, 256)
    out = qa.quant_attention(q, k, v, 69, None, 0.0625, num_splits=2, config=variant_config("split_n32_w4", 256, 3))
    ref = qa.quant_attention_reference(q, k, v, 69, None, 0.0625)
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"


def _patch_interpreter_bf16_dot() -> None:
    """Triton 3.6's interpreter multiplies bf16 tl.dot operands as their raw uint16 bits (numpy has no
    bf16; InterpreterBuilder.create_dot forgets to convert them), so any bf16 dot comes out as garbage
    (~1e9) under TRITON_INTERPRET=1. A bf16 query beside a dense bf16 side runs such a dot (that side
    keeps the query's type). Here the operands are widened to fp32 first, which is what a bf16 MMA
    computes (exact products, fp32 sums); the kernel is unchanged."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view("float32")
            return interpreter.TensorHandle(data, tl.float32)

        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def main() -> None:
    from tests.kernels.interpret_checks import run_checks

    _patch_interpreter_bf16_dot()
    checks = {name: (check, args) for name, args in _cases().items()}
    checks["fp32_falls_back"] = (check_fp32_falls_back, ())
    print(json.dumps(run_checks(checks)))


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    pytest.importorskip("triton")
    return run_module("tests.kernels.attention.test_quant_attention_split")


def test_split_matches_the_reference(results):
    assert_all_passed(results, len(_cases()) + 1)


def test_schemes_pick_split_where_it_fits():
    import torch

    pytest.importorskip("triton")
    from treeflash.kernels.attention.attention_launch import FMT_IDS, _dot_dtypes, _schemes, variant_config

    q8, q4, tq3 = FMT_IDS["q8_0"], FMT_IDS["q4_0"], FMT_IDS["tq3_0"]
    w4, w8 = variant_config("split_n32_w4", 256, 6), variant_config("split_n32_w8", 256, 6)
    assert _schemes(w4, tq3, tq3, torch.bfloat16, 256) == ("split", "split")
    assert _schemes(w4, q8, tq3, torch.float16, 256) == ("words", "split")  # q8_0 runs words in the same launch
    assert _schemes(w4, q4, 0, torch.bfloat16, 256) == ("split", "flat")  # beside a dense side
    assert _dot_dtypes("split", "flat", torch.bfloat16) == (torch.float16, torch.bfloat16)
    assert _dot_dtypes("split", "words", torch.bfloat16) == (torch.float16, torch.float16)
    assert _schemes(w4, tq3, q4, torch.float32, 256) == ("blocks_fast", "blocks_fast")  # fp32 query: fp32 path
    # parts must be dot operands (K: D/4 or D/8 >= 16) and keep every warp's p.v tiles busy (V: >= 8 x warps)
    assert _schemes(w4, tq3, tq3, torch.float16, 128) == ("split", "words")
    assert _schemes(w4, q4, q4, torch.float16, 128) == ("split", "split")
    assert _schemes(w4, tq3, q4, torch.float16, 64) == ("words", "words")
    assert _schemes(w4, q4, tq3, torch.float16, 64) == ("split", "words")
    assert _schemes(w8, q4, tq3, torch.float16, 256) == ("split", "words")
    assert _schemes(w8, tq3, q4, torch.float16, 256) == ("split", "split")


# ---------------------------------------------------------------- the tq3_0 inline PTX, emulated


def _ptx_run(asm: str, inputs: dict[int, int], outputs: int) -> list[int]:
    """Run a straight-line PTX block of 32-bit integer ops (mov, prmt, shr, shl, and, mad.lo, lop3) on
    Python ints: operands $N, named registers, or immediates. Returns $0..$outputs-1."""
    regs: dict[str, int] = {f"${n}": v & 0xFFFFFFFF for n, v in inputs.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & 0xFFFFFFFF

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith("//"):
            continue
        op, rest = line.split(None, 1)
        dst, *src = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in src]
        if op == "mov.b32":
            r = a[0]
        elif op == "shr.b32":
            r = a[0] >> a[1]
        elif op == "shl.b32":
            r = a[0] << a[1]
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "mad.lo.u32":
            r = a[0] * a[1] + a[2]
        elif op == "prmt.b32":  # default mode: selector nibble i picks byte i of the result from {a, b}
            pool = a[0] | a[1] << 32
            r = 0
            for i in range(4):
                s = a[2] >> (4 * i) & 0xF
                byte = pool >> (8 * (s & 7)) & 0xFF
                if s & 8:
                    byte = 0xFF if byte & 0x80 else 0
                r |= byte << (8 * i)
        elif op == "lop3.b32":
            r = 0
            for bit in range(32):
                idx = (a[0] >> bit & 1) << 2 | (a[1] >> bit & 1) << 1 | (a[2] >> bit & 1)
                r |= (a[3] >> idx & 1) << bit
        else:
            raise ValueError(f"unsupported PTX op {op!r}")
        regs[dst] = r & 0xFFFFFFFF
    return [regs[f"${n}"] for n in range(outputs)]


def test_tq3_split_asm_matches_the_unpacking():
    """TQ3_SPLIT_ASM (pack=2: two int32 elements in, part r's fp16 pair in $r, element 0 in the low half)
    gives, for random elements, the fp16 bits of +-C[m] that the interpreter's shift path (_tq3_parts)
    computes: part 4h + j = bits 2j of magnitude byte h (element bits 8h..), sign bit 4h + j of the sign
    byte (element bits 16..)."""
    pytest.importorskip("triton")
    from treeflash.kernels.kv import kv_formats as formats
    from treeflash.kernels.attention.kv_split import TQ3_SPLIT_ASM

    asm = TQ3_SPLIT_ASM.value
    assert set(re.findall(r"\$(\d+)", asm)) == {str(n) for n in range(10)}  # 8 outputs, 2 inputs
    halves = [struct.unpack("<H", struct.pack("<e", c))[0] for c in formats.TQ3_CENTROIDS]
    rng = random.Random(0)
    for _ in range(300):
        x = [rng.getrandbits(24) | rng.getrandbits(8) << 24 for _ in range(2)]  # bits 24-31: ignored
        out = _ptx_run(asm, {8: x[0], 9: x[1]}, 8)
        for r in range(8):
            h, j = divmod(r, 4)
            for e in range(2):
                m = x[e] >> (8 * h + 2 * j) & 3
                neg = x[e] >> (16 + 4 * h + j) & 1
                want = halves[m] | neg << 15
                assert out[r] >> (16 * e) & 0xFFFF == want, (r, e, hex(x[e]))


if __name__ == "__main__":
    main()
