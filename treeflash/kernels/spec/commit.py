"""Commit kernels: after a verify step, the kept path's rows become contiguous committed state, as
one launch per cache instead of PyTorch's gather + scatter (+ concatenation) sequences. Each runs
inside the commit CUDA graph, whose kernel count is on the critical path of every speculative step.

- `commit_rows_table`: attention cache rows in every buffer of a `RowTable` (the K and V of all the
  attention layers of a model in one launch: a DDTree step's commit was one launch per layer, ~3.4 us
  each on the H200): rows dest[j] <- rows src[j] for j < n (n on the device). Each program loads its column block of all kept rows at once ([P, BLOCK]:
  the loads are independent, so a path costs about one memory latency, not one per row), then a
  barrier, then the stores: in place, nothing is overwritten before every row is read, as in the
  reference's index_select + index_copy_. (The first version walked j = 0, 1, ... with two
  dependent loads per row: ~P memory latencies per launch, once per attention layer per step.)
- `conv_window_commit`: a Gated DeltaNet conv window [C, K-1] <- the columns `rows` of
  cat(window^T, inputs)^T ([C, K-1+T]; inputs may be a row-strided view); each program loads its
  channels' K-1 new columns before it stores any of them (in place).

Each has a plain-torch reference; the wrappers run the reference off CUDA (and the kernels under
TRITON_INTERPRET=1 in the tests).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl
from treeflash.kernels.pointwise.norm import _interpreting


@triton.jit
def _commit_rows_kernel(TABLE, DEST, SRC, N, ROW: tl.constexpr, P: tl.constexpr, P2: tl.constexpr, BLOCK: tl.constexpr,
                        ELT: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    col = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    buf = tl.load(TABLE + tl.program_id(1)).to(tl.pointer_type(ELT))  # this program's buffer, from the table
    j = tl.arange(0, P2)  # [P2]
    keep = (j < P) & (j < tl.load(N))
    src = tl.load(SRC + j, mask=keep, other=0).to(tl.int64)
    dest = tl.load(DEST + j, mask=keep, other=0).to(tl.int64)
    ok = keep[:, None] & (col < ROW)[None, :]  # [P2, BLOCK]
    val = tl.load(buf + src[:, None] * ROW + col[None, :], mask=ok)
    tl.debug_barrier()  # every row of the block is read (by every thread) before any is overwritten
    tl.store(buf + dest[:, None] * ROW + col[None, :], val, mask=ok)


_INT_TYPES = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


class RowTable:
    """Buffers [S, ...] (contiguous, one row size in bytes, e.g. every attention layer's K and V) that
    `commit_rows_table` moves rows in with one launch: their addresses in a device tensor, made once
    (so a CUDA graph can hold it). The rows are copied as integers of the element size: any dtype."""

    def __init__(self, buffers: list[torch.Tensor]):
        if not buffers:
            raise ValueError("RowTable: no buffers")
        first = buffers[0]
        self.row_bytes = first[0].numel() * first.element_size()
        for b in buffers:
            if not b.is_contiguous() or b[0].numel() * b.element_size() != self.row_bytes or b.device != first.device:
                raise ValueError("RowTable: contiguous buffers of one row size (in bytes) on one device expected")
        size = min(b.element_size() for b in buffers)
        size = max(s for s in _INT_TYPES if s <= size and self.row_bytes % s == 0)
        self.tl_type = _INT_TYPES[size]
        self.row = self.row_bytes // size  # elements of tl_type per row
        self.buffers = buffers  # held: the table points into them
        self.table = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=first.device)


def move_rows_reference(buffers, dest: torch.Tensor, src: torch.Tensor, n: torch.Tensor) -> None:
    """commit_rows_table in plain torch: in each buffer, rows dest[j] <- rows src[j] for j < n[0]."""
    m = int(n.reshape(-1)[0])
    for buf in buffers:
        buf.index_copy_(0, dest[:m], buf.index_select(0, src[:m]))


def commit_rows_table(rows: RowTable, dest: torch.Tensor, src: torch.Tensor, n: torch.Tensor) -> None:
    """In every buffer of `rows`: rows dest[j] <- rows src[j] for j < n[0], in place, in one launch.
    dest, src [P] long (increasing; src[j] >= dest[j]), n [1] long, all on the buffers' device."""
    if not (rows.table.is_cuda or _interpreting()):
        return move_rows_reference(rows.buffers, dest, src, n)
    if dest.shape != src.shape or dest.dim() != 1 or n.numel() != 1:
        raise ValueError("commit_rows_table: dest and src [P], n [1] expected")
    p = dest.shape[0]
    p2 = triton.next_power_of_2(p)
    block = max(16, min(1024, triton.next_power_of_2(rows.row), 8192 // p2))  # a [P2, BLOCK] tile of <= 8K values
    _commit_rows_kernel[(triton.cdiv(rows.row, block), len(rows.buffers))](
        rows.table, dest, src, n, ROW=rows.row, P=p, P2=p2, BLOCK=block, ELT=rows.tl_type, **pdl.kwargs(dest))


@triton.jit
def _conv_column(WIN, X, ROWS, j: tl.constexpr, c, ok, stride_x, K1: tl.constexpr):
    r = tl.load(ROWS + j)
    if r < K1:
        val = tl.load(WIN + c * K1 + r, mask=ok, other=0.0)
    else:
        val = tl.load(X + (r - K1) * stride_x + c, mask=ok, other=0.0).to(WIN.dtype.element_ty)
    return val


@triton.jit
def _conv_commit_kernel(WIN, X, ROWS, C, stride_x, K1: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = c < C
    # every new column is loaded before any is stored (the window is rewritten in place); K1 <= 4
    v0 = _conv_column(WIN, X, ROWS, 0, c, ok, stride_x, K1)
    if K1 > 1:
        v1 = _conv_column(WIN, X, ROWS, 1, c, ok, stride_x, K1)
    if K1 > 2:
        v2 = _conv_column(WIN, X, ROWS, 2, c, ok, stride_x, K1)
    if K1 > 3:
        v3 = _conv_column(WIN, X, ROWS, 3, c, ok, stride_x, K1)
    tl.store(WIN + c * K1, v0, mask=ok)
    if K1 > 1:
        tl.store(WIN + c * K1 + 1, v1, mask=ok)
    if K1 > 2:
        tl.store(WIN + c * K1 + 2, v2, mask=ok)
    if K1 > 3:
        tl.store(WIN + c * K1 + 3, v3, mask=ok)


def conv_window_commit_reference(window: torch.Tensor, inputs: torch.Tensor, rows: torch.Tensor) -> None:
    cat = torch.cat((window.transpose(0, 1), inputs.to(window.dtype)), dim=0)  # [K-1+T, C]
    window.copy_(cat.index_select(0, rows).transpose(0, 1))


def conv_window_commit(window: torch.Tensor, inputs: torch.Tensor, rows: torch.Tensor) -> None:
    """window [C, K-1] (in place) <- columns `rows` [K-1] long of cat(window^T, inputs [T, C])^T."""
    if not (window.is_cuda or _interpreting()):
        return conv_window_commit_reference(window, inputs, rows)
    c, k1 = window.shape
    if not window.is_contiguous() or inputs.dim() != 2 or inputs.shape[1] != c or inputs.stride(1) != 1 or rows.shape != (k1,):
        raise ValueError(f"conv_window_commit: contiguous window [C, K-1], inputs [T, {c}] (rows contiguous), rows [{k1}] expected")
    if not 1 <= k1 <= 4:
        raise ValueError(f"conv_window_commit: conv kernels of 2-5 taps, got {k1 + 1}")
    block = 512
    _conv_commit_kernel[(triton.cdiv(c, block),)](window, inputs, rows, c, inputs.stride(0), K1=k1, BLOCK=block,
                                                  **pdl.kwargs(window))
