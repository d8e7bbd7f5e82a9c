"""Merging split-K attention partials (kernels/attention/quant_attention.py): each split of the key axis leaves
an unnormalized online-softmax state per query row (m: the running max in log2 units, l: the sum of
2^(s - m), acc: the weighted sum of values); the output is

    out = sum_s w_s acc_s / sum_s w_s l_s,   w_s = 2^(m_s - max_s m_s).

`_combine_kernel` is the launch after the partials. A split with no visible key has l = 0 and weight
0; with SKIP_EMPTY (balanced splits, some past the end) it may have left its acc rows unwritten, and
they are not read.
The reference is quant_attention_reference (the whole attention in plain torch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from treeflash.kernels.launch import pdl


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
