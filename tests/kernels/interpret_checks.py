"""Kernel-vs-reference checks, run in a subprocess with TRITON_INTERPRET=1 (Triton on the CPU).

`python -m tests.kernels.interpret_checks GROUP` prints one JSON object {check: error or null}.
A subprocess keeps the interpreter switch (read by triton.jit when a kernel is defined) out
of the pytest process, where other tests import Triton normally; this module imports the
kernel modules only inside the checks, so pytest can import it to list the check names.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

from tests.kernels.kv.kv_write_checks import (check_cache_kernel_path, check_quantize, check_quantize_at_slots,
                                            check_quantize_rejects_bad_input, check_quantize_rotated)
from treeflash.kernels.kv import kv_formats as formats

QUANT = ("q8_0", "q4_0", "tq3_0")
ALL = ("bf16", "q8_0", "q4_0", "tq3_0")


def _planes(name: str, x: torch.Tensor):
    from treeflash.kernels.kv.kv_quant import Planes, quantize_into_reference

    fmt = formats.get_format(name)
    if fmt.is_dense:
        return Planes(name, None, x.to(fmt.dense_dtype).contiguous())
    s, d = x.shape[1], x.shape[2]
    scales = torch.zeros(x.shape[0], s, fmt.num_scales(d), dtype=torch.float16)
    codes = torch.zeros(x.shape[0], s, fmt.code_bytes(d), dtype=fmt.code_dtype)
    quantize_into_reference(name, x, scales, codes, 0)
    return Planes(name, scales, codes)


def _tree_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def check_attention(
    fmt_k: str, fmt_v: str, head_dim: int = 64, heads: int = 6, kv_heads: int = 2, num_new: int = 1,
    start: int = 150, parents: list[int] | None = None, splits: int | None = 3, dtype: torch.dtype = torch.float32,
    prefetch: bool = True,
) -> None:
    import dataclasses

    from treeflash.kernels.attention.attention_launch import launch_config
    from treeflash.kernels.attention.quant_attention import quant_attention, quant_attention_reference

    length = start + num_new + 5  # rows past start + T exist but must not be read
    k = _planes(fmt_k, torch.randn(length, kv_heads, head_dim))
    v = _planes(fmt_v, torch.randn(length, kv_heads, head_dim))
    q = torch.randn(num_new, heads, head_dim).to(dtype)
    mask = None if parents is None else _tree_mask(parents)
    scale = head_dim**-0.5
    config = dataclasses.replace(launch_config(head_dim, num_new * heads // kv_heads), prefetch=prefetch)
    out = quant_attention(q, k, v, start, mask, scale, num_splits=splits, config=config)
    ref = quant_attention_reference(q.float(), k, v, start, mask, scale)
    assert out.dtype == dtype and out.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (out.float() - ref).abs().max().item()
    assert err < tol, f"max error {err:.3g} >= {tol}"


def check_attention_rotated_keys(fmt_k: str, fmt_v: str, num_new: int, head_dim: int = 64, masked: bool = False,
                                 dtype: torch.dtype = torch.float32) -> None:
    """q8_0 / q4_0 keys stored rotated (Planes.rotated, CacheSpec.rotate_keys): the kernel rotates the query,
    the reference reads the keys back un-rotated; both equal, and equal to attention over the keys quantized
    in the rotated domain."""
    from treeflash.kernels.attention.quant_attention import (quant_attention, quant_attention_masked, quant_attention_masked_reference,
                                                   quant_attention_reference)

    heads, kv_heads, start = 6, 2, 120
    length = start + num_new + 5
    keys = torch.randn(length, kv_heads, head_dim)
    keys[..., 3] *= 10.0  # an outlier channel, where the rotation pays
    k = _planes(fmt_k, formats.rotate(keys))._replace(rotated=True)
    v = _planes(fmt_v, torch.randn(length, kv_heads, head_dim))
    q = torch.randn(num_new, heads, head_dim).to(dtype)
    if masked:
        key_mask = torch.rand(num_new, length) < 0.7
        key_mask[:, 0] = True
        out = quant_attention_masked(q, k, v, key_mask, head_dim**-0.5, num_splits=3)
        ref = quant_attention_masked_reference(q.float(), k, v, key_mask, head_dim**-0.5)
    else:
        out = quant_attention(q, k, v, start, None, head_dim**-0.5, num_splits=3)
        ref = quant_attention_reference(q.float(), k, v, start, None, head_dim**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = (out.float() - ref).abs().max().item()
    assert err < tol, f"max error {err:.3g} >= {tol}"


def check_attention_masked(fmt_k: str, fmt_v: str, num_new: int, splits: int | None) -> None:
    """Static mode: every slot of the cache under a [T, S] key mask (holes included)."""
    from treeflash.kernels.attention.quant_attention import quant_attention_masked, quant_attention_masked_reference

    length, heads, kv_heads, d = 150, 4, 2, 64
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    q = torch.randn(num_new, heads, d)
    key_mask = torch.rand(num_new, length) < 0.6
    key_mask[:, 0] = True  # every query sees at least one key
    out = quant_attention_masked(q, k, v, key_mask, 0.125, num_splits=splits)
    ref = quant_attention_masked_reference(q, k, v, key_mask, 0.125)
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"


def check_attention_masked_end(fmt_k: str, fmt_v: str, num_new: int, splits: int | None, length: int = 300) -> None:
    """Static mode with `slots`: only slots [0, slots[-1]] are read. Every row past it is NaN, so
    reading one (even under the mask: 0 * NaN) would show; splits past the end do no work."""
    from treeflash.kernels.attention.quant_attention import quant_attention_masked, quant_attention_masked_reference

    heads, kv_heads, d, start = 4, 2, 64, 70
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    end = start + num_new  # slots [start, end) are this step's
    for p in (k, v):
        (p.scales if p.scales is not None else p.codes)[end:] = float("nan")
    q = torch.randn(num_new, heads, d)
    key_mask = torch.rand(num_new, length) < 0.6
    key_mask[:, end:] = False
    key_mask[:, 0] = True
    slots = torch.arange(start, end)
    out = quant_attention_masked(q, k, v, key_mask, 0.125, num_splits=splits, slots=slots)
    cut = lambda p: p._replace(scales=None if p.scales is None else p.scales[:end].contiguous(), codes=p.codes[:end].contiguous())  # noqa: E731
    ref = quant_attention_masked_reference(q, cut(k), cut(v), key_mask[:, :end].contiguous(), 0.125)
    assert torch.isfinite(out).all(), "a row past the last slot was read"
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"


def check_attention_all_visible(fmt_k: str, fmt_v: str, num_new: int, splits: int | None, length: int = 300) -> None:
    """Static mode without a key mask (a bidirectional draft block): every slot up to slots[-1] is seen,
    nothing past it is read (those rows are NaN), and the result equals the reference under the mask
    that says so."""
    from treeflash.kernels.attention.quant_attention import quant_attention_masked, quant_attention_masked_reference, visible_up_to

    heads, kv_heads, d, start = 4, 2, 64, 70
    k = _planes(fmt_k, torch.randn(length, kv_heads, d))
    v = _planes(fmt_v, torch.randn(length, kv_heads, d))
    end = start + num_new
    for p in (k, v):
        (p.scales if p.scales is not None else p.codes)[end:] = float("nan")
    q = torch.randn(num_new, heads, d)
    slots = torch.arange(start, end)
    out = quant_attention_masked(q, k, v, None, 0.125, num_splits=splits, slots=slots)
    assert torch.isfinite(out).all(), "a row past the last slot was read"
    cut = lambda p: p._replace(scales=None if p.scales is None else p.scales[:end].contiguous(), codes=p.codes[:end].contiguous())  # noqa: E731
    ref = quant_attention_masked_reference(q, cut(k), cut(v), visible_up_to(slots, num_new, end), 0.125)
    err = (out - ref).abs().max().item()
    assert err < 1e-5, f"max error {err:.3g}"
    ref_none = quant_attention_masked_reference(q, cut(k), cut(v), None, 0.125, slots=slots)  # the reference's own None
    assert (ref_none - ref).abs().max().item() == 0.0


def check_attention_rejects_bad_input() -> None:
    from treeflash.kernels.attention.quant_attention import quant_attention

    k = _planes("q8_0", torch.randn(16, 2, 64))
    q = torch.randn(2, 6, 64)
    bad = [
        dict(q=torch.randn(2, 5, 64)),  # heads not a multiple of kv heads
        dict(q=torch.randn(2, 6, 64).double()),
        dict(start=15),  # start + T past the cache
        dict(tree_mask=torch.ones(3, 3, dtype=torch.bool)),
        dict(k=k._replace(scales=k.scales.float())),
    ]
    for over in bad:
        args = dict(q=q, k=k, v=k, start=4, tree_mask=None, scale=0.125) | over
        try:
            quant_attention(**args)
        except ValueError:
            continue
        raise AssertionError(f"accepted bad input {list(over)}")


def groups() -> dict[str, dict]:
    quant = {
        f"quantize_{n}_d{d}_{str(t)[6:]}": (check_quantize, (n, d, t))
        for n in QUANT
        for d, t in ((32, torch.float32), (64, torch.bfloat16), (128, torch.float32), (256, torch.bfloat16))
    }
    quant |= {f"quantize_at_slots_{n}": (check_quantize_at_slots, (n,)) for n in QUANT}
    quant |= {f"quantize_rotated_{n}_d{d}": (check_quantize_rotated, (n, d, t, off))
              for n in ("q8_0", "q4_0") for d, t, off in ((64, torch.float32, True), (128, torch.bfloat16, False), (256, torch.bfloat16, True))}
    quant["quantize_rejects_bad_input"] = (check_quantize_rejects_bad_input, ())
    # every format as K and as V, each pair of compressed formats once
    pairs = [(a, b) for a in ALL for b in ALL if a == b or "bf16" in (a, b) or a < b]
    attn = {f"decode_{a}_{b}": (check_attention, (a, b)) for a, b in pairs}
    tree = [-1, 0, 0, 1, 2, 2, 4]  # siblings 1/2 and 4/5 must not see each other
    attn |= {
        f"verify_tree_{a}_{b}": (check_attention, (a, b, 64, 6, 2, len(tree), 100, tree)) for a, b in
        [("q8_0", "q8_0"), ("q4_0", "tq3_0"), ("tq3_0", "q4_0"), ("bf16", "q8_0")]
    }
    attn |= {
        "decode_f32_tq3_0": (check_attention, ("f32", "tq3_0")),
        "verify_causal_no_prefix": (check_attention, ("q8_0", "tq3_0", 64, 6, 2, 9, 0, None)),
        "verify_tree_across_splits": (check_attention, ("q4_0", "q8_0", 64, 4, 2, 7, 60, tree, 2)),
        "decode_mha_d32_short": (check_attention, ("tq3_0", "q8_0", 32, 2, 2, 1, 5, None, None)),
        "decode_gqa8_d128_one_split": (check_attention, ("q4_0", "tq3_0", 128, 8, 1, 1, 200, None, 1)),
        "decode_d256_many_splits": (check_attention, ("tq3_0", "tq3_0", 256, 4, 2, 1, 300, None, 64)),
        "verify_rows_over_block_m": (check_attention, ("q8_0", "q4_0", 64, 8, 1, 5, 40, None)),  # 40 rows
        "verify_no_prefetch": (check_attention, ("tq3_0", "q4_0", 64, 6, 2, 7, 90, tree, 3, torch.float32, False)),
        "decode_fp16": (check_attention, ("q8_0", "q4_0", 64, 6, 2, 1, 150, None, 3, torch.float16)),
        "verify_fp16": (check_attention, ("tq3_0", "tq3_0", 64, 6, 2, 7, 90, tree, 3, torch.float16)),
        # q8_0 / q4_0 keys stored rotated (CacheSpec.rotate_keys): the kernel rotates the query
        "rotated_keys_decode_q8_0_q8_0": (check_attention_rotated_keys, ("q8_0", "q8_0", 1)),
        "rotated_keys_verify_q4_0_tq3_0": (check_attention_rotated_keys, ("q4_0", "tq3_0", 6)),
        "rotated_keys_decode_d256_q8_0": (check_attention_rotated_keys, ("q8_0", "q8_0", 1, 256)),
        "rotated_keys_masked_d256_q4_0": (check_attention_rotated_keys, ("q4_0", "q4_0", 1, 256, True)),
        "rotated_keys_decode_bf16_query": (check_attention_rotated_keys, ("q8_0", "q4_0", 1, 64, False, torch.bfloat16)),
        "masked_decode_q8_0_tq3_0": (check_attention_masked, ("q8_0", "tq3_0", 1, 2)),
        "masked_verify_tq3_0_q4_0": (check_attention_masked, ("tq3_0", "q4_0", 6, None)),
        "masked_end_decode_bf16": (check_attention_masked_end, ("bf16", "bf16", 1, 8)),
        "masked_end_verify_q8_0_tq3_0": (check_attention_masked_end, ("q8_0", "tq3_0", 5, None)),
        "masked_end_decode_q4_0_one_split": (check_attention_masked_end, ("q4_0", "q4_0", 1, 1)),
        # a long buffer: most of the planned splits lie past the end
        "masked_end_decode_long_buffer": (check_attention_masked_end, ("bf16", "q8_0", 1, None, 2048)),
        # balanced splits (static mode: the filled blocks shared equally whatever the buffer's length): 3
        # splits over a 2048-slot buffer whose end is slot 74 + num_new; more splits than filled blocks
        # leaves some empty
        "balanced_masked_end_long": (check_attention_masked_end, ("bf16", "bf16", 5, 3, 2048)),
        "balanced_decode_empty_splits": (check_attention_masked_end, ("bf16", "q8_0", 1, 8, 2048)),
        "balanced_verify_q4_0_tq3_0": (check_attention_masked_end, ("q4_0", "tq3_0", 6, 2)),
        # one split writes the output itself (no partials, no combine): tq3_0 V's rotated output, a tree,
        # a long buffer's end
        "one_split_verify_tree_tq3_0_v": (check_attention, ("q8_0", "tq3_0", 64, 6, 2, len(tree), 100, tree, 1)),
        "one_split_masked_end_verify": (check_attention_masked_end, ("bf16", "q4_0", 4, 1)),
        "all_visible_draft_block_bf16": (check_attention_all_visible, ("bf16", "bf16", 16, None)),
        "all_visible_one_split": (check_attention_all_visible, ("bf16", "bf16", 16, 1)),
        "all_visible_balanced_q8_0": (check_attention_all_visible, ("q8_0", "q8_0", 5, 3, 2048)),
        "attention_rejects_bad_input": (check_attention_rejects_bad_input, ()),
        # the cache's CUDA path (kernels forced on under the interpreter) against its reference path
        "cache_kernel_path_q8_0_q8_0": (check_cache_kernel_path, ("q8_0", "q8_0")),
        "cache_kernel_path_q4_0_tq3_0_d256": (check_cache_kernel_path, ("q4_0", "tq3_0", 256)),
        "cache_kernel_path_static_tq3_0_q4_0": (check_cache_kernel_path, ("tq3_0", "q4_0", 64, True)),
        "cache_kernel_path_static_q8_0_bf16_d128": (check_cache_kernel_path, ("q8_0", "bf16", 128, True)),
    }
    return {"quantize": quant, "attention": attn}


def run_checks(checks: dict[str, tuple]) -> dict[str, str | None]:
    """{name: (fn, args)} -> {name: None, or the error and its traceback}; each check seeded alike."""
    results = {}
    for name, (fn, args) in checks.items():
        torch.manual_seed(0)
        try:
            fn(*args)
            results[name] = None
        except Exception as e:  # reported per check by the pytest side
            results[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    return results


def main(group: str) -> None:
    print(json.dumps(run_checks(groups()[group])))


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported (the checks import lazily)
    main(sys.argv[1])
