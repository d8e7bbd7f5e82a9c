"""Batch-invariant linear for 1 <= M <= 128 rows: y [M, N] = x [M, K] @ w [N, K]^T (+ bias) (+= add_into),
beside its plain-torch contract `rows_gemm_reference`. Not called by the model yet (docs/performance.md).

Why: a decode step projects 1 row and a verify pass 2..128; for lossless speculative decoding in bf16 both
must compute every row the same way, bit for bit. gemv (one row, CUDA cores) and F.linear (cuBLAS, whose
kernel and split-K change with M) do not, so near-ties between two tokens can flip. Here row i of the
result does not depend on M or on the other rows:

- Operands swapped: a program computes acc [BLOCK_N, BLOCK_M] = w_tile [BLOCK_N, BLOCK_K] @ x_tile^T
  [BLOCK_K, BLOCK_M] (weight rows on the MMA's M side, 64 a warpgroup on sm_90; rows of x on its N side)
  and stores it transposed, as kernels/quant/rows_q4k.py does.
- BLOCK_M is 16 for every M: M = 1 pads x to 16 rows (masked, zero-filled), M > 16 launches more programs
  along M, each running the same instructions. An output element of an MMA depends only on its weight row
  and its row of x, so the position of a row in its tile does not matter.
- fp32 accumulation over a fixed loop of K tiles, tiles in increasing K order.
- An optional split over K whose count comes from (N, K) only (`rows_gemm_config`), never from M: each of
  SPLIT programs writes an fp32 partial P [SPLIT, M, N], and `_split_sum_kernel` adds them in split order,
  then the bias, then add_into, and rounds once (no atomics). SPLIT 1 does the same epilogue in the main
  kernel. M is not specialized on (do_not_specialize), so M = 1 and M = 16 run one compiled kernel.

Launch config: `RowsGemmConfig` (block_n, block_k, split, num_warps, num_stages), from `rows_gemm_config(n, k)`:
`TABLE`'s entry for the shape, else `default_config(n, k)`: BLOCK_N 64 (one warpgroup's wgmma rows), BLOCK_K 128
(64 if K <= 4096 is not a multiple of 128), and the smallest split in 1, 2, 4, 8 that gives >= 132 programs at
M <= 16 (one per H200 SM; 4 stages of 20 KB let two share one) while keeping >= 8 K tiles a split. None of it is timed yet: bench.gpu_gemv
--rows-gemm-ab is the A/B (docs/performance.md).

On sm_90 (tests/kernels/linear/test_rows_gemm_compile.py) the dot is an async m64n16k16 wgmma with both tiles
in shared memory, filled by the pipeliner's cp.async num_stages tiles ahead (4 x 20 KB at the default); ptxas
reports 40-48 registers (90 for the 128-row gate_up entries) and no spills.

Precision: bf16 / fp16 x run the native tensor-core dot (fp32 accumulation); fp32 x the IEEE fp32 dot (not
tf32). Under the Triton interpreter bf16 tl.dot is wrong, so there bf16 x goes in as fp32 (a product of
two bf16 values is exact in fp32; only the summation order differs from the GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting

BLOCK_M = 16  # rows of x per program, for every M (the invariance rests on it)
MAX_ROWS = 128
SMS = 132  # an H200's SMs: the split rule's target is a program per SM at M <= 16


@dataclass(frozen=True)
class RowsGemmConfig:
    block_n: int = 64  # weight rows (output columns) per program: the MMA's M side
    block_k: int = 128  # columns of K per loop step
    split: int = 1  # programs over K per (n-block, m-block); > 1: fp32 partials + _split_sum_kernel
    num_warps: int = 4
    num_stages: int = 4  # the pipeliner's K tiles in flight (async copies into shared memory)

    def __post_init__(self):
        for name, lo in (("block_n", 16), ("block_k", 16), ("num_warps", 1)):
            v = getattr(self, name)
            if v < lo or v & (v - 1):
                raise ValueError(f"RowsGemmConfig: {name} must be a power of two >= {lo}, got {v}")
        if self.split < 1 or self.num_stages < 1:
            raise ValueError(f"RowsGemmConfig: split and num_stages must be >= 1, got {self.split}, {self.num_stages}")


def default_config(n: int, k: int) -> RowsGemmConfig:
    """The untimed rule (module docstring): a function of the weight shape only."""
    block_n = 64
    block_k = 128 if k % 128 == 0 or k > 4096 else 64
    tiles = triton.cdiv(k, block_k)
    n_blocks = triton.cdiv(n, block_n)
    split = 1
    while split < 8 and n_blocks * split < SMS and tiles // (2 * split) >= 8:
        split *= 2
    return RowsGemmConfig(block_n=block_n, block_k=block_k, split=split)


# (N, K) -> config. Untimed: only the wide gate_up weights differ from the rule (128 weight rows a program, two
# warpgroups, so half the programs re-read x); bench.gpu_gemv --rows-gemm-ab decides what goes here.
TABLE: Mapping[tuple[int, int], RowsGemmConfig] = MappingProxyType({
    (24576, 4096): RowsGemmConfig(block_n=128, block_k=128, split=1, num_warps=8, num_stages=3),  # Qwen3-8B gate_up
    (34816, 5120): RowsGemmConfig(block_n=128, block_k=128, split=1, num_warps=8, num_stages=3),  # Qwen3.5-27B gate_up
})


def rows_gemm_config(n: int, k: int) -> RowsGemmConfig:
    """The launch config for an [N, K] weight: TABLE's entry, else default_config. Never depends on M."""
    return TABLE.get((n, k)) or default_config(n, k)


def rows_gemm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        add_into: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K] (bias [N], add_into [M, N]) -> [M, N] in x.dtype: the fp32 product, + bias,
    + add_into, rounded once (a new tensor; add_into is not written)."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    if add_into is not None:
        y = y + add_into.float()
    return y.to(x.dtype)


@triton.jit(do_not_specialize=["M"])  # one compile for every M: M = 1 runs the same code as M = 16
def _rows_gemm_kernel(X, W, B, R, Y, P, M, N, K, TILES: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr, PARTIAL: tl.constexpr,
                      HAS_BIAS: tl.constexpr, ADD: tl.constexpr, DOT_F32: tl.constexpr):
    """Program (n-block, split s, m-block): acc [BLOCK_N, BLOCK_M] over K tiles [s TILES, (s + 1) TILES), in order.
    X [M, K], W [N, K], Y and R [M, N] contiguous; P [SPLIT, M, N] fp32 (PARTIAL). Weight rows past N are
    clamped (loads unmasked, results dropped); rows of x past M masked (zero-filled, never read)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows = output columns
    s = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    m_ok = m < M
    w_ptr = W + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * K  # [BLOCK_N, 1]
    x_ptr = X + m.to(tl.int64)[None, :] * K  # [1, BLOCK_M]
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for t in range(TILES):
        k = (s * TILES + t) * BLOCK_K + kk  # [BLOCK_K]
        if EVEN_K:
            w = tl.load(w_ptr + k[None, :])  # [BLOCK_N, BLOCK_K]
            xt = tl.load(x_ptr + k[:, None], mask=m_ok[None, :], other=0.0)  # [BLOCK_K, BLOCK_M]
        else:
            k_ok = k < K
            w = tl.load(w_ptr + k[None, :], mask=k_ok[None, :], other=0.0)
            xt = tl.load(x_ptr + k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        if DOT_F32:
            acc += tl.dot(w.to(tl.float32), xt.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(w, xt)
    mask = (rows < N)[:, None] & m_ok[None, :]
    out = m.to(tl.int64)[None, :] * N + rows[:, None]  # [BLOCK_N, BLOCK_M] offsets into [M, N]
    if PARTIAL:
        tl.store(P + s.to(tl.int64) * M * N + out, acc, mask=mask)
    else:  # the epilogue of _split_sum_kernel, in its order
        if HAS_BIAS:
            acc += tl.load(B + rows, mask=rows < N, other=0.0).to(tl.float32)[:, None]
        if ADD:
            acc += tl.load(R + out, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _split_sum_kernel(P, B, R, Y, M, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                      ADD: tl.constexpr):
    """Y [M, N] = (sum over s of P [s, M, N], in order of s) + bias + R, one rounding."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(P + s * M * N + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs % N, mask=ok, other=0.0).to(tl.float32)
    if ADD:
        acc += tl.load(R + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=ok)


def _check(x: torch.Tensor, weight: torch.Tensor, bias, add_into) -> None:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"rows_gemm: x must be [M, K] with 1 <= M <= {MAX_ROWS}, got {tuple(x.shape)}")
    n, k = weight.shape
    if x.shape[1] != k or weight.dtype != x.dtype or weight.device != x.device or not weight.is_contiguous():
        raise ValueError(f"rows_gemm: weight must be a contiguous [N, {x.shape[1]}] of x's dtype and device, "
                         f"got {tuple(weight.shape)} {weight.dtype}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"rows_gemm: x must be bf16, fp16 or fp32, got {x.dtype}")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous() or bias.device != x.device):
        raise ValueError(f"rows_gemm: bias must be a contiguous [{n}] on x's device")
    if add_into is not None and (add_into.shape != (x.shape[0], n) or add_into.dtype != x.dtype
                                 or not add_into.is_contiguous() or add_into.device != x.device):
        raise ValueError(f"rows_gemm: add_into must be a contiguous [{x.shape[0]}, {n}] of x's dtype and device")


def rows_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              config: RowsGemmConfig | None = None, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T (+ bias): x [M, K] (1 <= M <= 128), weight [N, K] contiguous -> [M, N] in x's dtype. With add_into
    ([M, N], x's dtype, contiguous): add_into = x W^T + bias + add_into in place, one rounding, returned. Runs the
    kernel on CUDA or under TRITON_INTERPRET=1, the reference elsewhere. config: rows_gemm_config(N, K) unless
    given (a bench's sweep)."""
    _check(x, weight, bias, add_into)
    if not (x.is_cuda or _interpreting()):
        y = rows_gemm_reference(x, weight, bias, add_into)
        return y if add_into is None else add_into.copy_(y)
    m, k = x.shape
    n = weight.shape[0]
    x = x.contiguous()
    cfg = config or rows_gemm_config(n, k)
    tiles = triton.cdiv(triton.cdiv(k, cfg.split), cfg.block_k)  # K tiles per split
    split = triton.cdiv(triton.cdiv(k, cfg.block_k), tiles)  # the split as launched (<= cfg.split)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if add_into is None else add_into
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else y  # [SPLIT, M, N]
    dot_f32 = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _interpreting())
    grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, BLOCK_M))
    _rows_gemm_kernel[grid](
        x, weight, bias if bias is not None else y, y, y, part, m, n, k, TILES=tiles, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, BLOCK_M=BLOCK_M, EVEN_K=k % cfg.block_k == 0 and tiles * split * cfg.block_k == k,
        PARTIAL=split > 1, HAS_BIAS=bias is not None, ADD=add_into is not None, DOT_F32=dot_f32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        _split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, bias if bias is not None else y, y, y, m, n, SPLIT=split,
                                                       BLOCK=1024, HAS_BIAS=bias is not None, ADD=add_into is not None,
                                                       num_warps=4)
    return y
