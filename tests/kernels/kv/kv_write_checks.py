"""Checks of the KV cache's write side under TRITON_INTERPRET=1, run through interpret_checks' "quantize" and
"attention" groups: the quantize-on-write kernels (plain and with the keys' rotation) bit for bit against the torch
quantizer, their input checks, and the QuantizedAttentionCache's kernel path (forced on) against its reference path."""

from __future__ import annotations

import torch

from treeflash.kernels.kv import kv_formats as formats


def check_quantize(name: str, head_dim: int, dtype: torch.dtype) -> None:
    from treeflash.kernels.kv.kv_quant import quantize_into, quantize_into_reference

    fmt = formats.get_format(name)
    x = (torch.randn(7, 3, head_dim) * 3).to(dtype)
    x[0, 0, :32] = 0  # an all-zero block: scale 0, no division by zero
    x[1, 1, 5] = -40.0  # an outlier
    shape_s, shape_c = (12, 3, fmt.num_scales(head_dim)), (12, 3, fmt.code_bytes(head_dim))
    got = torch.full(shape_s, 7.0, dtype=torch.float16), torch.full(shape_c, 1, dtype=fmt.code_dtype)
    want = got[0].clone(), got[1].clone()
    quantize_into(name, x, *got, slots=4)
    quantize_into_reference(name, x, *want, slots=4)
    assert torch.equal(got[0], want[0]), f"scales differ: {(got[0].float() - want[0].float()).abs().max()}"
    assert torch.equal(got[1], want[1]), f"codes differ in {(got[1] != want[1]).sum().item()} bytes"


def check_quantize_at_slots(name: str) -> None:
    """A [N] slots tensor (static mode) writes rows anywhere, out of order."""
    from treeflash.kernels.kv.kv_quant import quantize_into, quantize_into_reference

    fmt = formats.get_format(name)
    x = torch.randn(20, 2, 128)  # 40 rows: the tq3_0 kernel's 16-row tiles end inside the batch
    slots = torch.randperm(30)[:20]
    got = torch.zeros(30, 2, fmt.num_scales(128), dtype=torch.float16), torch.zeros(30, 2, fmt.code_bytes(128), dtype=fmt.code_dtype)
    want = got[0].clone(), got[1].clone()
    quantize_into(name, x, *got, slots=slots)
    quantize_into_reference(name, x, *want, slots=slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def check_quantize_rotated(name: str, head_dim: int, dtype: torch.dtype, offset: bool) -> None:
    """q8_0 / q4_0 rows centered and rotated in the write kernel (quantize_rotated_into): x a strided view (a key
    inside a fused qkv row), written at out-of-order slots, bit for bit the reference (rotate, then quantize)."""
    from treeflash.kernels.kv.kv_quant import quantize_rotated_into, quantize_rotated_into_reference

    fmt = formats.get_format(name)
    n, hkv = 9, 3  # 27 rows: the 16-row tiles end inside the batch
    x = (torch.randn(n, (hkv + 2) * head_dim) * 3).to(dtype)[:, head_dim: (hkv + 1) * head_dim].view(n, hkv, head_dim)
    x[0, 0] = 0  # an all-zero row: scale 0 in every block
    off = torch.randn(hkv, head_dim) if offset else None
    if off is not None:
        off[0] = x[0, 0].float()
    slots = torch.randperm(20)[:n]
    got = (torch.full((20, hkv, fmt.num_scales(head_dim)), 7.0, dtype=torch.float16),
           torch.full((20, hkv, fmt.code_bytes(head_dim)), 1, dtype=fmt.code_dtype))
    want = got[0].clone(), got[1].clone()
    quantize_rotated_into(name, x, *got, slots=slots, offset=off)
    quantize_rotated_into_reference(name, x, *want, slots=slots, offset=off)
    assert torch.equal(got[0], want[0]), f"scales differ: {(got[0].float() - want[0].float()).abs().max()}"
    assert torch.equal(got[1], want[1]), f"codes differ in {(got[1] != want[1]).sum().item()} bytes"


def check_cache_kernel_path(fmt_k: str, fmt_v: str, head_dim: int = 64, static: bool = False) -> None:
    """QuantizedAttentionCache with its kernel path forced on (the CUDA path: quantize-on-write kernels, keys centered,
    rotated and quantized in one launch, the query's rotation, the attention kernel) against the same cache on its
    reference path: a 6-token prefill, a decode and a 4-node verify (eager, or static as the CUDA graphs run it)."""
    from treeflash.kv.cache import CacheSpec
    from treeflash.kv.quantized import QuantizedAttentionCache

    hkv, heads, scale = 2, 6, head_dim**-0.5
    caches = [QuantizedAttentionCache(hkv, head_dim, CacheSpec(32, torch.float32, torch.device("cpu"), fmt_k, fmt_v))
              for _ in range(2)]
    caches[0].use_kernels = True
    assert not caches[1].use_kernels
    start = 0
    for num_new, tree in ((6, None), (1, None), (4, torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool))):
        # keys with a large shared part and an outlier channel (centering and rotation both matter)
        q = torch.randn(num_new, heads, head_dim)
        k = torch.randn(num_new, hkv, head_dim) + 2.0
        k[..., 5] *= 8.0
        v = torch.randn(num_new, hkv, head_dim)
        if static and start > 0:  # slots and a [T, max_len] key mask, as the CUDA graphs call it
            slots = torch.arange(start, start + num_new)
            key_mask = torch.zeros(num_new, 32, dtype=torch.bool)
            key_mask[:, :start] = True
            key_mask[:, start: start + num_new] = tree if tree is not None else torch.ones(num_new, num_new, dtype=torch.bool).tril()
            outs = [c.attend_static(q, k, v, slots, key_mask, scale) for c in caches]
        else:
            outs = [c.attend(q, k, v, start, tree, scale) for c in caches]
        err = ((outs[0] - outs[1]).abs().max() / outs[1].abs().max()).item()
        assert err < 2e-3, f"step at {start} ({num_new} tokens): kernel path off by {err:.3g}"
        start += num_new
    for side in ("k", "v"):  # the planes hold the same codes whichever path wrote them
        a, b = getattr(caches[0], side), getattr(caches[1], side)
        assert torch.equal(a.scales[:start], b.scales[:start]) if a.scales is not None else True, f"{side} scales differ"
        differing = (a.codes[:start] != b.codes[:start]).float().mean().item()
        assert differing < 1e-2, f"{side} codes differ in {differing:.2%} of bytes"


def check_quantize_rejects_bad_input() -> None:
    from treeflash.kernels.kv.kv_quant import quantize_into

    fmt = formats.get_format("q8_0")
    scales = torch.zeros(4, 2, 4, dtype=torch.float16)
    codes = torch.zeros(4, 2, 128, dtype=fmt.code_dtype)
    bad = [
        (torch.randn(2, 2, 128).transpose(0, 1), scales, codes, 0),  # not contiguous
        (torch.randn(2, 2, 128), scales.float(), codes, 0),  # scales not fp16
        (torch.randn(2, 2, 128), scales, codes, 3),  # past the end
        (torch.randn(2, 2, 64), scales, codes, 0),  # head_dim mismatch
    ]
    for args in bad:
        try:
            quantize_into("q8_0", *args)
        except ValueError:
            continue
        raise AssertionError(f"accepted bad input {[tuple(a.shape) if hasattr(a, 'shape') else a for a in args]}")
