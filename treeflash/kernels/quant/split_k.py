"""A split over K finished inside the GEMV: the last program of a tile adds the partials, in split order.

A narrow matrix (few rows) gives too few programs to fill the GPU, so the quant GEMVs split K over
SPLIT programs per tile of rows. Each program stores its fp32 partial in P [SPLIT, NUMEL] and takes a
ticket from the tile's counter (an atomic add, acquire-release at GPU scope, after every thread's
stores are fenced and the program has passed a barrier). The program that draws the last ticket reads
the SPLIT partials back in order s = 0, 1, ..., so the sum does not depend on which program finished
last, writes Y and sets the counter back to 0 for the next call (a CUDA graph replays the same
counters). This replaces a separate split-sum launch per GEMV: 312 of them, 1.4 ms of the 27B Q4_K_M
decode step (bench/results/profile_27b_q4_k_m.json).

counters: int32 [tiles] zeros, owned by the caller across calls (QuantLinear keeps one); without it
a zeroed tensor is made per call. Under the interpreter the programs run one after another, and the
atomics and the barrier are those of the interpreter (ASM False: no PTX fence).

    finish_split(acc, offs, ok, Y, P, CNT, numel, part, tile, SPLIT, ASM)   # in a kernel's epilogue
    part, cnt = split_buffers(numel, split, tiles, out, counters)            # on the host
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_COUNTER_BLOCK = 4  # QuantLinear's counters cover tiles of >= 4 rows (cdiv(N, 4) of them: 35 KB for 34,816 rows)

_FENCE_ASM = tl.constexpr("fence.acq_rel.gpu;\nmov.u32 $0, $1;")


@triton.jit
def _fence(v, ASM: tl.constexpr):
    """A GPU-scope fence by every thread (v: any int32 tensor, returned unchanged so the fence is kept in order)."""
    if ASM:
        v = tl.inline_asm_elementwise(_FENCE_ASM, "=r,r", [v], dtype=tl.int32, is_pure=False, pack=1)
    return v


@triton.jit
def finish_split(acc, offs, ok, Y, P, CNT, NUMEL, part, tile, SPLIT: tl.constexpr, ASM: tl.constexpr,
                 FUSED: tl.constexpr = True):
    """acc (fp32, any shape) is split `part`'s share of Y at offs (mask ok). SPLIT == 1: store it. Otherwise
    store it in P [SPLIT, NUMEL]; the last of the tile's SPLIT programs adds P[0..SPLIT-1] at offs in order
    into Y and resets CNT[tile] (FUSED False: only the partial is stored, split_sum_kernel adds them after)."""
    if SPLIT == 1:
        tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=ok)
    elif not FUSED:
        tl.store(P + part * NUMEL + offs, acc, mask=ok)
    else:
        tl.store(P + part * NUMEL + offs, acc, mask=ok)
        _fence(offs.to(tl.int32), ASM)
        tl.debug_barrier()
        ticket = tl.atomic_add(CNT + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            total = tl.load(P + offs, mask=ok, other=0.0, volatile=True)
            for s in tl.static_range(1, SPLIT):
                total += tl.load(P + s * NUMEL + offs, mask=ok, other=0.0, volatile=True)
            tl.store(Y + offs, total.to(Y.dtype.element_ty), mask=ok)
            tl.atomic_xchg(CNT + tile, 0, sem="relaxed", scope="gpu")


def split_buffers(numel: int, split: int, tiles: int, out: torch.Tensor,
                  counters: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(P fp32 [split, numel], the tiles' counters int32) for a launch of `split` programs a tile; split == 1:
    (out, out), unused by the kernel. counters: the caller's zeroed int32 counters if they cover `tiles`."""
    if split == 1:
        return out, out
    part = torch.empty(split, numel, dtype=torch.float32, device=out.device)
    if counters is None or counters.numel() < tiles:
        counters = torch.zeros(tiles, dtype=torch.int32, device=out.device)
    return part, counters


def finish_unfused(part: torch.Tensor, out: torch.Tensor, numel: int, split: int, fused: bool) -> None:
    """After a launch with FUSED False and split > 1: add the partials in order (gemv_q4k.split_sum_kernel)."""
    if split > 1 and not fused:
        from treeflash.kernels.quant.gemv_q4k import split_sum_kernel

        split_sum_kernel[(triton.cdiv(numel, 1024),)](part, out, numel, SPLIT=split, BLOCK=1024, num_warps=4)


def tile_counters(n: int, device) -> torch.Tensor:
    """The zeroed counters a layer of n output rows keeps for finish_split (tiles of >= MIN_COUNTER_BLOCK rows)."""
    return torch.zeros(triton.cdiv(max(n, 1), MIN_COUNTER_BLOCK), dtype=torch.int32, device=device)


__all__ = ["MIN_COUNTER_BLOCK", "finish_split", "finish_unfused", "split_buffers", "tile_counters"]
