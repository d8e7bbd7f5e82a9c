"""A DFlash static draft pass's slots and rotary rows in one launch (spec/dflash_model.forward_static).

The pass writes n context rows then B block rows into the draft cache at slots read from the device:

    slot[i] = start + i                if i < n and i < count   (a real context row)
              dump                     if i < n and i >= count  (a padding row: the buffer's last slot)
              start + count + i - n    if i >= n                (the block, after the real rows)

(count = n without a count), and gathers cos / sin at those slots from the rotary table
(models/layers.Rotary.reserve: [2, P, rotary_dim]). In torch that is ~8 launches (arange, compares,
adds, where, cat, the gather), each ~2-3 us inside the drafter's CUDA graph on the H200, for a few
hundred bytes. `draft_slots_ref` is the torch form, and the path off CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting


@triton.jit
def _draft_slots_kernel(START, COUNT, TABLE, SLOTS, CS, n, total, dump, plane, HAS_COUNT: tl.constexpr,
                        NB: tl.constexpr, RD: tl.constexpr):
    i = tl.arange(0, NB)
    ok = i < total
    start = tl.load(START)
    if HAS_COUNT:
        count = tl.load(COUNT)
    else:
        count = start * 0 + n
    ctx_slot = tl.where(i < count, start + i, start * 0 + dump)
    slot = tl.where(i < n, ctx_slot, start + count + (i - n))
    tl.store(SLOTS + i, slot, mask=ok)
    cols = tl.arange(0, RD)
    src = slot[:, None] * RD + cols[None, :]
    dst = i[:, None] * RD + cols[None, :]
    m = ok[:, None]
    tl.store(CS + dst, tl.load(TABLE + src, mask=m), mask=m)  # cos
    tl.store(CS + total * RD + dst, tl.load(TABLE + plane + src, mask=m), mask=m)  # sin


def draft_slot_ids(start: torch.Tensor, count: torch.Tensor | None, n: int, b: int, dump: int) -> torch.Tensor:
    """-> slots [n + b] long, in torch (the table-free path computes its cos / sin from them)."""
    ar = torch.arange(n + b, device=start.device)
    if count is None:
        return start + ar
    return torch.cat((torch.where(ar[:n] < count, start + ar[:n], dump), start + count + ar[:b]))


def draft_slots_ref(start: torch.Tensor, count: torch.Tensor | None, n: int, b: int, dump: int,
                    table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> slots [n + b] long, cos_sin [2, n + b, rotary_dim] (table's dtype)."""
    slots = draft_slot_ids(start, count, n, b, dump)
    return slots, table.index_select(1, slots)


def draft_slots(start: torch.Tensor,  # [1] long on the device: committed draft rows
                count: torch.Tensor | None,  # [1] long: real context rows of the n (None: all n)
                n: int, b: int, dump: int,
                table: torch.Tensor,  # [2, P, rotary_dim] contiguous, every slot < P
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> slots [n + b] long, cos_sin [2, n + b, rotary_dim]: one launch on CUDA (and in the interpreter)."""
    rd = table.shape[-1]
    if not ((table.is_cuda or _interpreting()) and table.is_contiguous() and rd >= 16 and rd & (rd - 1) == 0):
        return draft_slots_ref(start, count, n, b, dump, table)
    total = n + b
    slots = torch.empty(total, dtype=torch.long, device=table.device)
    cs = torch.empty(2, total, rd, dtype=table.dtype, device=table.device)
    _draft_slots_kernel[(1,)](start, count if count is not None else start, table, slots, cs, n, total, dump,
                              table.shape[1] * rd, HAS_COUNT=count is not None, NB=triton.next_power_of_2(total),
                              RD=rd, num_warps=4)
    return slots, cs
