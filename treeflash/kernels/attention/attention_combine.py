"""Merging split-K attention partials (kernels/attention/quant_attention.py): each split of the key axis leaves
an unnormalized online-softmax state per query row (m: the running max in log2 units, l: the sum of
2^(s - m), acc: the weighted sum of values); the output is

    out = sum_s w_s acc_s / sum_s w_s l_s,   w_s = 2^(m_s - max_s m_s).

`_combine_kernel` is the launch after the partials; `_merge_splits` is the same for the rows of one
program (the fused combine: the last split of a tile merges them). A split with no visible key has
l = 0 and weight 0; with SKIP_EMPTY it may have left its acc rows unwritten, and they are not read.
The reference is quant_attention_reference (the whole attention in plain torch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from treeflash.kernels.launch import pdl


@triton.jit
def _merge_splits(m_ptr, l_ptr, acc_ptr, out_ptr, rows, row_ok, num_rows, D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """out[rows] = sum_s w_s acc_s / sum_s w_s l_s, w_s = 2^(m_s - max m): _combine_kernel for the
    BLOCK_M rows of one program, splits added one after another."""
    m_max = tl.full(rows.shape, -1.0e30, tl.float32)
    for sp in range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(m_ptr + sp * num_rows + rows, mask=row_ok, other=-1.0e30, cache_modifier=".cg"))
    cols = tl.arange(0, D)
    num = tl.zeros((rows.shape[0], D), tl.float32)
    den = tl.zeros(rows.shape, tl.float32)
    for sp in range(NUM_SPLITS):
        r = sp * num_rows + rows
        w = tl.exp2(tl.load(m_ptr + r, mask=row_ok, other=-1.0e30, cache_modifier=".cg") - m_max)
        l_s = tl.load(l_ptr + r, mask=row_ok, other=0.0, cache_modifier=".cg")
        den += w * l_s
        a = tl.load(acc_ptr + r.to(tl.int64)[:, None] * D + cols[None, :], mask=(row_ok & (l_s > 0))[:, None], other=0.0,
                    cache_modifier=".cg")
        num += w[:, None] * a
    out = num / tl.where(row_ok, den, 1.0)[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, num_rows, num_splits,
    D: tl.constexpr, D_CHUNK: tl.constexpr, SPLITS: tl.constexpr, SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    # program (row, chunk of D): out = sum_s w_s acc_s / sum_s w_s l_s, w_s = 2^(m_s - max m)
    row = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, SPLITS)
    ok = sp < num_splits
    m = tl.load(m_ptr + sp * num_rows + row, mask=ok, other=float("-inf"))
    l = tl.load(l_ptr + sp * num_rows + row, mask=ok, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))  # [SPLITS]
    d = tl.program_id(1) * D_CHUNK + tl.arange(0, D_CHUNK)
    if SKIP_EMPTY:  # a split with no visible key (l = 0, weight 0 either way) may have left its acc unwritten
        ok = ok & (l > 0)
    acc = tl.load(acc_ptr + (sp[:, None] * num_rows + row) * D + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty))
