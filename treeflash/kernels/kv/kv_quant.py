"""Quantize-on-write: new K/V rows into a compressed cache's planes (Triton, with the torch reference).

Planes of one cache tensor (layouts in treeflash/kernels/kv/kv_formats.py, a leaf module of pure functions
that both the cache (treeflash/kv/quantized.py) and these kernels read the format definitions from):
    scales: [max_len, num_kv_heads, head_dim / 32] fp16
    codes:  [max_len, num_kv_heads, code_bytes] uint8 (q8_0: [.., head_dim] int8)
`quantize_into(name, x, scales, codes, slots)` writes x [N, Hkv, D] into slots start..start+N-1
(slots an int start) or slots[0..N-1] (a [N] long tensor on x's device: no host sync, so it can be
captured in a CUDA graph). Each row is quantized on its own: a row written here equals
`formats.quantize` of it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from treeflash.kernels.kv import kv_formats as formats
from treeflash.kernels.kv.rotate import rotate_rows_reference

TQ3_ROWS = 16  # rows per program of the tq3_0 kernel (tl.dot needs M >= 16)


class Planes(NamedTuple):
    """One cache tensor (K or V) as the kernels see it."""

    name: str  # a concrete format name (formats.FORMATS), never "auto"
    scales: torch.Tensor | None  # [S, Hkv, D / 32] fp16; None for dense formats
    codes: torch.Tensor  # [S, Hkv, code_bytes]; dense formats: the rows themselves [S, Hkv, D]
    # q8_0 / q4_0 rows stored after the Hadamard rotation (formats.rotate; K only: the attention kernel
    # then rotates the query, as it does for tq3_0 keys, which are always rotated)
    rotated: bool = False


@triton.jit
def _round_half_away(v):
    return tl.where(v < 0, -tl.floor(-v + 0.5), tl.floor(v + 0.5))


@triton.jit
def _safe_inverse(d):
    return tl.where(d == 0, 0.0, 1.0 / tl.where(d == 0, 1.0, d))


@triton.jit
def _dest_row(slot_ptr, row, num_kv_heads):
    """Source row (token * Hkv + head) -> destination row (slot * Hkv + head) in the planes."""
    return tl.load(slot_ptr + row // num_kv_heads) * num_kv_heads + row % num_kv_heads


@triton.jit
def _q8_0_blocks(x):
    """x [M, 32] fp32 blocks -> (d [M], codes [M, 32]: integers in -127..127, still fp32)."""
    d = tl.max(tl.abs(x), axis=1) / 127.0
    return d, _round_half_away(x * _safe_inverse(d)[:, None])


@triton.jit
def _q4_0_blocks(x, M: tl.constexpr):
    """x [M, 32] fp32 blocks -> (d [M], packed [M, 16] int32: byte i = q[i] | q[i + 16] << 4)."""
    j = tl.arange(0, 32)[None, :]
    a = tl.abs(x)
    amax = tl.max(a, axis=1)
    first = tl.min(tl.where(a == amax[:, None], j, 32), axis=1)  # ggml keeps the first largest
    d = tl.sum(tl.where(j == first[:, None], x, 0.0), axis=1) / -8.0
    q = tl.floor(x * _safe_inverse(d)[:, None] + 8.5)
    q = tl.minimum(tl.maximum(q, 0.0), 15.0).to(tl.int32)
    return d, tl.sum(tl.reshape(q, (M, 2, 16)) << (4 * tl.arange(0, 2))[None, :, None], axis=1)


@triton.jit
def _q8_0_kernel(x_ptr, scale_ptr, code_ptr, slot_ptr, num_kv_heads, D: tl.constexpr):
    # one program = one row (token, kv head): [D / 32, 32] blocks
    NB: tl.constexpr = D // 32
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, NB)[:, None] * 32 + tl.arange(0, 32)[None, :]
    d, q = _q8_0_blocks(tl.load(x_ptr + row * D + offs).to(tl.float32))
    dst = _dest_row(slot_ptr, row, num_kv_heads)
    tl.store(scale_ptr + dst * NB + tl.arange(0, NB), d.to(tl.float16))
    tl.store(code_ptr + dst * D + offs, q.to(tl.int8))


@triton.jit
def _q4_0_kernel(x_ptr, scale_ptr, code_ptr, slot_ptr, num_kv_heads, D: tl.constexpr):
    NB: tl.constexpr = D // 32
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, NB)[:, None] * 32 + tl.arange(0, 32)[None, :]
    d, packed = _q4_0_blocks(tl.load(x_ptr + row * D + offs).to(tl.float32), NB)  # packed [NB, 16]
    dst = _dest_row(slot_ptr, row, num_kv_heads)
    tl.store(scale_ptr + dst * NB + tl.arange(0, NB), d.to(tl.float16))
    b_offs = tl.arange(0, NB)[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(code_ptr + dst * (D // 2) + b_offs, packed.to(tl.uint8))


@triton.jit
def _block_rotated_kernel(
    x_ptr, off_ptr, rot_ptr, scale_ptr, code_ptr, slot_ptr, num_rows, num_kv_heads, stride_xt, stride_xh,
    FMT: tl.constexpr, D: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, HAS_OFFSET: tl.constexpr,
):
    # q8_0 (FMT 1) / q4_0 (FMT 2) rows centered and rotated on the way in (keys under CacheSpec.rotate_keys): program
    # (row tile, 32-value block) takes its block of (x - offset) R^T from the group's G channels, [ROWS, G] @
    # [G, 32], and codes it as _q8_0_kernel / _q4_0_kernel code a block (the same numbers as kernels/kv/rotate.py's
    # rows fed to them: one launch instead of two, no contiguous copy of x)
    NB: tl.constexpr = D // 32
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    blk = tl.program_id(1)
    g0 = (blk * 32 // G) * G  # the block's group, first channel
    ok = rows < num_rows
    t, h = rows // num_kv_heads, rows % num_kv_heads
    gi = tl.arange(0, G)
    j = tl.arange(0, 32)
    x = tl.load(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + (g0 + gi)[None, :], mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)
    if HAS_OFFSET:
        x = x - tl.load(off_ptr + h[:, None] * D + (g0 + gi)[None, :], mask=ok[:, None], other=0.0)
    rot_t = tl.load(rot_ptr + (blk * 32 - g0 + j)[None, :] * G + gi[:, None])  # R^T[:, block]: [G, 32]
    xb = tl.dot(x, rot_t, input_precision="ieee")  # [ROWS, 32]
    dst = _dest_row(slot_ptr, tl.where(ok, rows, 0), num_kv_heads)  # padding rows: stores are masked
    if FMT == 1:
        d, q = _q8_0_blocks(xb)
        tl.store(code_ptr + dst[:, None] * D + blk * 32 + j[None, :], q.to(tl.int8), mask=ok[:, None])
    else:
        d, packed = _q4_0_blocks(xb, ROWS)  # [ROWS, 16]
        tl.store(code_ptr + dst[:, None] * (D // 2) + blk * 16 + tl.arange(0, 16)[None, :], packed.to(tl.uint8), mask=ok[:, None])
    tl.store(scale_ptr + dst * NB + blk, d.to(tl.float16), mask=ok)


@triton.jit
def _tq3_0_kernel(
    x_ptr, scale_ptr, code_ptr, rot_ptr, slot_ptr, num_rows, num_kv_heads,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,  # centroids
    B0: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr,  # cuts between them
    SQ: tl.constexpr, D: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr,
):
    # program (row tile, 32-value block): this block of the rotated group, x [ROWS, G] @ R^T[:, block] ([G, 32] of R:
    # a whole [128, 128] fp32 R as one operand spilled registers, ~100 us a launch on the H200), divided by the
    # group's norm taken before the rotation (R is orthonormal; formats.quantize_tq3_0 does the same). H200, 27B
    # shape, 4 rows: 6.8 us a launch (stop 30); with the norm from all GB rotated blocks it was 22 us (a program per
    # group: 23 us), the GB fp32 dots in a row setting the time
    NB: tl.constexpr = D // 32
    GB: tl.constexpr = G // 32  # blocks per group
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    blk = tl.program_id(1)
    grp = blk // GB
    ok = rows < num_rows
    gi = tl.arange(0, G)
    bi = tl.arange(0, 32)
    dst = _dest_row(slot_ptr, tl.where(ok, rows, 0), num_kv_heads)  # padding rows: stores are masked
    x = tl.load(x_ptr + rows[:, None] * D + grp * G + gi[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    sq = tl.sum(x * x, axis=1)
    rot_t = tl.load(rot_ptr + ((blk % GB) * 32 + bi)[None, :] * G + gi[:, None])  # R^T[:, block]: [G, 32]
    xb = tl.dot(x, rot_t, input_precision="ieee")  # [ROWS, 32]
    y = xb * (_safe_inverse(tl.sqrt(sq)) * SQ)[:, None]  # SQ = sqrt(G / 128)
    a = tl.abs(y)
    mag = (a > B0).to(tl.int32) + (a > B1).to(tl.int32) + (a > B2).to(tl.int32)
    neg = (y < 0).to(tl.int32)
    c = tl.where(mag == 0, C0, tl.where(mag == 1, C1, tl.where(mag == 2, C2, C3)))
    s = tl.sqrt(tl.sum(xb * xb, axis=1)) / tl.sqrt(tl.sum(c * c, axis=1))  # [ROWS]
    tl.store(scale_ptr + dst * NB + blk, s.to(tl.float16), mask=ok)
    # magnitudes: byte i holds values 4i + k at bits 2k; signs: byte 8 + i holds values 8i + k at bit k
    mags = tl.sum(tl.reshape(mag, (ROWS, 8, 4)) << (2 * tl.arange(0, 4))[None, None, :], axis=2)  # [ROWS, 8]
    signs = tl.sum(tl.reshape(neg, (ROWS, 4, 8)) << tl.arange(0, 8)[None, None, :], axis=2)  # [ROWS, 4]
    base = dst[:, None] * (NB * 12) + blk * 12
    tl.store(code_ptr + base + tl.arange(0, 8)[None, :], mags.to(tl.uint8), mask=ok[:, None])
    tl.store(code_ptr + base + 8 + tl.arange(0, 4)[None, :], signs.to(tl.uint8), mask=ok[:, None])


def _slot_tensor(slots: int | torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    if isinstance(slots, int):
        return torch.arange(slots, slots + n, device=device)
    return slots


def _check(name: str, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, slots: int | torch.Tensor,
           strided: bool = False) -> None:
    fmt = formats.get_format(name)
    if fmt.is_dense:
        raise ValueError(f"quantize_into: {name} is a dense type, nothing to quantize")
    laid_out = x.stride(-1) == 1 if strided and x.dim() == 3 else x.is_contiguous()
    if x.dim() != 3 or not laid_out or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        kind = "[N, Hkv, D] float tensor with a contiguous last axis" if strided else "contiguous [N, Hkv, D] float tensor"
        raise ValueError(f"quantize_into: x must be a {kind}, got {x.dtype} {tuple(x.shape)}")
    n, hkv, d = x.shape
    fmt.check_head_dim(d)
    if d & (d - 1):
        raise ValueError(f"quantize_into: the Triton kernels need a power-of-two head_dim, got {d}")
    want_s, want_c = (hkv, fmt.num_scales(d)), (hkv, fmt.code_bytes(d))
    if scales.dtype != torch.float16 or tuple(scales.shape[1:]) != want_s or not scales.is_contiguous():
        raise ValueError(f"quantize_into: scales must be contiguous fp16 [S, {want_s[0]}, {want_s[1]}]")
    if codes.dtype != fmt.code_dtype or tuple(codes.shape[1:]) != want_c or not codes.is_contiguous():
        raise ValueError(f"quantize_into: codes must be contiguous {fmt.code_dtype} [S, {want_c[0]}, {want_c[1]}]")
    if scales.shape[0] != codes.shape[0] or not (x.device == scales.device == codes.device):
        raise ValueError("quantize_into: x, scales and codes must be on one device, scales and codes of one length")
    if isinstance(slots, int):
        if slots < 0 or slots + n > codes.shape[0]:
            raise ValueError(f"quantize_into: slots {slots}..{slots + n} outside the cache of {codes.shape[0]}")
    elif slots.shape != (n,) or slots.dtype != torch.long or slots.device != x.device:
        raise ValueError(f"quantize_into: slots must be a [{n}] long tensor on {x.device}")


def quantize_into(
    name: str, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, slots: int | torch.Tensor
) -> None:
    """Triton: x [N, Hkv, D] -> rows `slots` of scales and codes (format `name`). A slots tensor
    is trusted to be in range (checking it would sync with the host)."""
    _check(name, x, scales, codes, slots)
    n, hkv, d = x.shape
    num_rows = n * hkv
    if num_rows == 0:
        return
    slot = _slot_tensor(slots, n, x.device)
    if name == "q8_0":
        _q8_0_kernel[(num_rows,)](x, scales, codes, slot, hkv, D=d, num_warps=1)
    elif name == "q4_0":
        _q4_0_kernel[(num_rows,)](x, scales, codes, slot, hkv, D=d, num_warps=1)
    else:
        g = min(formats.TQ3_GROUP, d)
        rot = formats.tq3_rotation(g, x.device)
        c0, c1, c2, c3 = formats.TQ3_CENTROIDS
        b0, b1, b2 = formats.TQ3_BOUNDS
        grid = (triton.cdiv(num_rows, TQ3_ROWS), d // 32)
        _tq3_0_kernel[grid](
            x, scales, codes, rot, slot, num_rows, hkv,
            C0=c0, C1=c1, C2=c2, C3=c3, B0=b0, B1=b1, B2=b2, SQ=math.sqrt(g / formats.TQ3_GROUP),
            D=d, G=g, ROWS=TQ3_ROWS, num_warps=4,
        )


def quantize_rotated_into(
    name: str, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, slots: int | torch.Tensor,
    offset: torch.Tensor | None = None,
) -> None:
    """Triton, q8_0 / q4_0: rows of (x - offset) rotated (kernels/kv/rotate.py's rotation) -> rows `slots`, in one launch.
    x [N, Hkv, D] needs only a contiguous last axis; offset [Hkv, D] fp32 or None."""
    if name not in ("q8_0", "q4_0"):
        raise ValueError(f"quantize_rotated_into: q8_0 or q4_0, got {name} (tq3_0 always rotates: quantize_into)")
    _check(name, x, scales, codes, slots, strided=True)
    n, hkv, d = x.shape
    if offset is not None and (offset.shape != (hkv, d) or offset.dtype != torch.float32 or not offset.is_contiguous()):
        raise ValueError(f"quantize_rotated_into: offset must be contiguous fp32 [{hkv}, {d}], got {offset.dtype} {tuple(offset.shape)}")
    if n * hkv == 0:
        return
    g = min(formats.TQ3_GROUP, d)
    rot = formats.tq3_rotation(g, x.device)
    grid = (triton.cdiv(n * hkv, TQ3_ROWS), d // 32)
    _block_rotated_kernel[grid](
        x, offset if offset is not None else rot, rot, scales, codes, _slot_tensor(slots, n, x.device), n * hkv, hkv,
        x.stride(0), x.stride(1), FMT=1 if name == "q8_0" else 2, D=d, G=g, ROWS=TQ3_ROWS, HAS_OFFSET=offset is not None,
        num_warps=4,
    )


def quantize_rotated_into_reference(
    name: str, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, slots: int | torch.Tensor,
    offset: torch.Tensor | None = None,
) -> None:
    """Plain torch, same contract as `quantize_rotated_into`."""
    quantize_into_reference(name, rotate_rows_reference(x, torch.float32, offset), scales, codes, slots)


def quantize_into_reference(
    name: str, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, slots: int | torch.Tensor
) -> None:
    """Plain torch, same contract as `quantize_into` (any head_dim the format accepts)."""
    s, c = formats.quantize(name, x)
    slot = _slot_tensor(slots, x.shape[0], x.device)
    scales.index_copy_(0, slot, s)
    codes.index_copy_(0, slot, c)
