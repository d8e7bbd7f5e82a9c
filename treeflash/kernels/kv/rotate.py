"""The KV cache's Hadamard rotation of query, key and output rows in one launch (Triton), with its torch reference.

Rotated keys (tq3_0 always; q8_0 / q4_0 under CacheSpec.rotate_keys) need the query rotated the same
way, and a tq3_0 V gives the output rotated. In torch each is a cast, a matmul per group and a cast
back: three launches per attention layer and step inside a CUDA graph. `rotate_rows` does it in one
(the keys themselves are rotated inside their write kernels: kv_quant.quantize_rotated_into, tq3_0's):

    out[n, h, :] = blockdiag(R, ..., R) (x[n, h, :] - offset[h, :])     (inverse: R^T in place of R)

R [G, G] is formats.tq3_rotation (G = min(128, D), orthonormal). The product runs in fp32 (IEEE,
not tf32), so the result equals the reference's fp32 rotation to rounding, then is cast to `dtype`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.kv import kv_formats as formats

ROWS = 16  # rows (token x head) per program: tl.dot needs M >= 16
COLS = 32  # output channels per program


@triton.jit
def _rotate_kernel(
    x_ptr, off_ptr, rot_ptr, out_ptr, num_rows, num_heads, stride_xt, stride_xh,
    D: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, HAS_OFFSET: tl.constexpr,
    INVERSE: tl.constexpr,
):
    # program (row tile, column tile): out[rows, c0:c0+COLS] from its group's G input channels. A [G, COLS] slice
    # of R per program keeps the operand in registers (a whole [128, 128] fp32 R spilled: ~120 us a launch on
    # the H200 for 24 rows)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    c0 = tl.program_id(1) * COLS
    g0 = (c0 // G) * G  # the group's first channel
    ok = rows < num_rows
    t, h = rows // num_heads, rows % num_heads
    gi = tl.arange(0, G)
    ci = c0 - g0 + tl.arange(0, COLS)  # output columns within the group
    if INVERSE:  # x = y @ R: [G, COLS] = R[:, ci]
        rot = tl.load(rot_ptr + gi[:, None] * G + ci[None, :])
    else:  # y = x @ R^T: [G, COLS] = R[ci, :]^T
        rot = tl.load(rot_ptr + ci[None, :] * G + gi[:, None])
    x = tl.load(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + (g0 + gi)[None, :], mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)
    if HAS_OFFSET:
        x = x - tl.load(off_ptr + h[:, None] * D + (g0 + gi)[None, :], mask=ok[:, None], other=0.0)
    y = tl.dot(x, rot, input_precision="ieee")  # [ROWS, COLS]
    tl.store(out_ptr + rows[:, None] * D + (c0 + tl.arange(0, COLS))[None, :], y.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def rotate_rows(x: torch.Tensor, dtype: torch.dtype, offset: torch.Tensor | None = None, inverse: bool = False) -> torch.Tensor:
    """x [N, H, D] (last axis contiguous), offset [H, D] fp32 or None -> [N, H, D] contiguous in `dtype`:
    each row minus its head's offset, then rotated per group of G = min(128, D) channels (inverse: un-rotated)."""
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(f"rotate_rows: x must be [N, H, D] with a contiguous last axis, got {tuple(x.shape)} {x.stride()}")
    n, heads, d = x.shape
    g = min(formats.TQ3_GROUP, d)
    if d % g or g & (g - 1) or g < 16:
        raise ValueError(f"rotate_rows: head_dim {d} must be a power of two >= 16 (or a multiple of {formats.TQ3_GROUP})")
    if offset is not None and (offset.shape != (heads, d) or offset.dtype != torch.float32 or not offset.is_contiguous()):
        raise ValueError(f"rotate_rows: offset must be contiguous fp32 [{heads}, {d}], got {offset.dtype} {tuple(offset.shape)}")
    out = torch.empty(n, heads, d, dtype=dtype, device=x.device)
    if n * heads == 0:
        return out
    rot = formats.tq3_rotation(g, x.device)
    cols = min(COLS, g)
    _rotate_kernel[(triton.cdiv(n * heads, ROWS), d // cols)](
        x, offset if offset is not None else rot, rot, out, n * heads, heads, x.stride(0), x.stride(1),
        D=d, G=g, ROWS=ROWS, COLS=cols, HAS_OFFSET=offset is not None, INVERSE=inverse, num_warps=4,
    )
    return out


def rotate_rows_reference(x: torch.Tensor, dtype: torch.dtype, offset: torch.Tensor | None = None, inverse: bool = False) -> torch.Tensor:
    """Plain torch, same contract as `rotate_rows`."""
    x = x.float() if offset is None else x.float() - offset
    return (formats.unrotate(x) if inverse else formats.rotate(x)).to(dtype)
