"""One-row matrix-vector product for decode steps: y = W x (W [N, K] row-major, x [K]).

At batch 1 a projection is a stream of its weight through the SMs, so what matters is keeping
enough bytes in flight on every SM. cuBLAS picks few, large tiles for narrow outputs (e.g. Qwen3-8B's
o_proj, [4096, 4096]: 64 tiles of 64 rows, split-K 2, plus a separate reduce kernel), which leaves
the H200 under a wave and reads at 60-80% of the bandwidth (docs/performance.md).

Program (n-block, split) reads BLOCK_N rows x K / SPLIT_K columns, BLOCK_K at a time (the loop is
unrolled, so the loads of every step are issued before their multiply-adds), on CUDA cores in fp32.
With SPLIT_K > 1 each program writes its BLOCK_N partial sums to a scratch row; the last of the
n-block's programs to finish (an atomic ticket per n-block) adds the SPLIT_K partials in split order,
writes y and resets the ticket. So the result does not depend on which program finishes last
(deterministic, no atomics on the values), and there is no second launch.

A one-row path with the RMSNorm / SwiGLU / residual fused in (a rolled K loop without split-K) read the
8B o_proj at 12.2 us where this kernel takes 9.6; it was removed with the fused layers (docs/journal.md).

`gemv_reference` is the plain-torch contract (F.linear, fp32 accumulation); `gemv` runs the kernel
on CUDA or under TRITON_INTERPRET=1, the reference elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl

from treeflash.kernels.pointwise.activation import silu_mul_ref
from treeflash.kernels.pointwise.norm import _interpreting
from treeflash.kernels.launch.scratch import scratch


# kernels/linear/projection.py's `linear` and `apply` send one-row projections of a model's GemvTables shapes on CUDA
# through gemv (an H200: 8B decode 204 -> 217 tokens/s, 27B 70 -> 73; docs/performance.md); every
# other projection stays on cuBLAS. Measured and removed (docs/journal.md): the residual add + RMSNorm
# as a GEMV epilogue or prologue, and a verify step's rows through the one-row kernel (rows mode).


@triton.jit
def _gemv_kernel(
    X, W, B, Y, P, T, N,
    R,  # with ADD: the residual stream (Y itself)
    K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr, PDL: tl.constexpr = False, ADD: tl.constexpr = False,
):
    """ADD: y = W x + R, one rounding after the add (Y is R: the residual stream updated in place;
    see `gemv`'s add_into)."""
    pid_n, s = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = W + rows.to(tl.int64)[:, None] * K
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    # with PDL the first weight tile is read while the previous kernel (whose output is x) finishes
    pdl.trigger(PDL)
    k0 = s * K_SPLIT + tl.arange(0, BLOCK_K)
    w0 = tl.load(w_rows + k0[None, :], mask=row_ok[:, None] & (k0 < K)[None, :], other=0.0)
    pdl.wait(PDL)
    for i in tl.static_range(K_SPLIT // BLOCK_K):  # unrolled: every step's loads go out first
        k = s * K_SPLIT + i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + k, mask=k_ok, other=0.0).to(tl.float32)
        if i == 0:
            w = w0
        else:
            w = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    part = tl.sum(acc, axis=1)  # [BLOCK_N]
    if SPLIT_K == 1:
        if HAS_BIAS:
            part += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
        if ADD:  # this program's rows of the stream: read, then overwritten by the same program
            part += tl.load(R + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(Y + rows, part.to(Y.dtype.element_ty), mask=row_ok)
    else:
        tl.store(P + s * N + rows, part, mask=row_ok)
        ticket = tl.atomic_add(T + pid_n, 1, sem="acq_rel")  # release our partials, acquire the others'
        if ticket == SPLIT_K - 1:  # the last program of this n-block: add the partials in split order
            total = tl.zeros((BLOCK_N,), tl.float32)
            for j in tl.static_range(SPLIT_K):
                total += tl.load(P + j * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
            if ADD:
                total += tl.load(R + rows, mask=row_ok, other=0.0).to(tl.float32)
            tl.store(Y + rows, total.to(Y.dtype.element_ty), mask=row_ok)
            tl.atomic_xchg(T + pid_n, 0)  # ready for the next call (and the next CUDA-graph replay)


@triton.jit
def _gemv_swiglu_kernel(X, W, Y, I, eps, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        STEPS: tl.constexpr, PDL: tl.constexpr = False, FOLD: tl.constexpr = False):
    """y[j] = silu(g_j) u_j for j in this program's BLOCK_N rows, g = W[:I] x and u = W[I:] x (W = [gate; up],
    [2I, K]): both tiles of each step in one program, so no [2I] intermediate and no SiLU-mul launch.
    g and u are rounded to the output dtype first, as the unfused path (gemv, then silu_mul) does.
    FOLD (a folded norm: W carries the norm's gain, x is the raw stream): g and u then times 1 / rms(x),
    from the sum of squares of the x this program streams anyway (silu_mul's `rows`)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < I
    g_rows = W + rows.to(tl.int64)[:, None] * K
    u_rows = W + (rows + I).to(tl.int64)[:, None] * K
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    pdl.trigger(PDL)
    k0 = tl.arange(0, BLOCK_K)
    g0 = tl.load(g_rows + k0[None, :], mask=row_ok[:, None] & (k0 < K)[None, :], other=0.0)
    u0 = tl.load(u_rows + k0[None, :], mask=row_ok[:, None] & (k0 < K)[None, :], other=0.0)
    pdl.wait(PDL)
    ss = tl.zeros((BLOCK_K,), tl.float32)
    for i in tl.static_range(STEPS):  # unrolled, as in _gemv_kernel
        k = i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + k, mask=k_ok, other=0.0).to(tl.float32)
        if FOLD:
            ss += x * x
        if i == 0:
            wg, wu = g0, u0
        else:
            wg = tl.load(g_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wu = tl.load(u_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g += wg.to(tl.float32) * x[None, :]
        acc_u += wu.to(tl.float32) * x[None, :]
    g = tl.sum(acc_g, axis=1)
    u = tl.sum(acc_u, axis=1)
    g = g.to(Y.dtype.element_ty).to(tl.float32)
    u = u.to(Y.dtype.element_ty).to(tl.float32)
    if FOLD:
        r = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        g, u = g * r, u * r
    tl.store(Y + rows, (g / (1.0 + tl.exp(-g)) * u).to(Y.dtype.element_ty), mask=row_ok)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # output rows per program
    block_k: int  # columns per unrolled step
    split_k: int  # programs per n-block (1: no scratch, no ticket)
    num_warps: int

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GemvConfig: {name} must be a power of two, got {v}")
        if self.split_k < 1:
            raise ValueError(f"GemvConfig: split_k must be >= 1, got {self.split_k}")


def gemv_config(n: int, k: int) -> GemvConfig:
    """The launch configuration for an [N, K] weight: the tuned one, else a generic one (no autotuning)."""
    return TUNED.linear.get((n, k)) or GemvConfig(block_n=8, block_k=512, split_k=1 if k <= 4096 else 2, num_warps=4)


Shapes = Mapping[tuple[int, int], GemvConfig]


@dataclass(frozen=True)
class GemvTables:
    """Which one-row projections run on the GEMVs, with which launch configuration: weight shape (N, K) ->
    GemvConfig. `linear`: gemv (projection.linear / apply / folded); `swiglu`: gemv_swiglu, keyed by the
    [2I, K] gate_up weight (split_k 1). Every other shape stays on cuBLAS. Read-only once built; a model
    takes its tables from fuse_projections (TUNED, the H200's, unless a tool or test passes others), and
    `with_entries` / `without_swiglu` make new ones."""

    linear: Shapes = field(default_factory=dict)
    swiglu: Shapes = field(default_factory=dict)

    def __post_init__(self):
        for name in ("linear", "swiglu"):
            table = dict(getattr(self, name))
            for key, cfg in table.items():
                if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(v, int) and v > 0 for v in key)):
                    raise ValueError(f"GemvTables.{name}: keys are (N, K) weight shapes, got {key!r}")
                if not isinstance(cfg, GemvConfig) or (name == "swiglu" and cfg.split_k != 1):
                    raise ValueError(f"GemvTables.{name}[{key}]: a GemvConfig{' with split_k 1' if name == 'swiglu' else ''}, got {cfg!r}")
            object.__setattr__(self, name, MappingProxyType(table))

    def __deepcopy__(self, memo) -> "GemvTables":
        return self  # immutable: a copied model shares its tables

    def __reduce__(self):
        return GemvTables, (dict(self.linear), dict(self.swiglu))

    def with_entries(self, linear: Shapes | None = None, swiglu: Shapes | None = None) -> "GemvTables":
        """These tables with more (or replaced) entries."""
        return GemvTables({**self.linear, **(linear or {})}, {**self.swiglu, **(swiglu or {})})

    def without_swiglu(self) -> "GemvTables":
        """gate_up + SiLU-mul on cuBLAS + silu_mul for every shape (the A/B baseline of gemv_swiglu)."""
        return GemvTables(self.linear, {})


# (N, K) -> the fastest configuration of an H200 sweep where it beats cuBLAS (bench/gpu_gemv.py;
# bench/results/gpu_gemv*.json, us per call with every weight byte from memory).
# `projection.linear` and `apply` use gemv only for these shapes; every other one stays on cuBLAS (e.g. gate/up, 96-99% of
# the bandwidth there already).
# Since stop 30 the Qwen3-8B o_proj / down and Qwen3.5-27B (5120, 6144) entries are the fastest inside the whole graphed
# decode step (bench/gemv_in_graph.py; bench/results/s30/gemv_graph_*): alone, 2 x 2048 o_proj and 4 x 1024 down
# were faster, in the step they were not (8B pipelined 229.9 -> 238.2 tokens/s; 27B 75.9 -> 77.2)
_TUNED_LINEAR = {  # bench/results/gpu_gemv.json (wide grid), gpu_gemv_focus.json
    (6144, 4096): GemvConfig(8, 1024, 1, 4),  # Qwen3-8B q/k/v: 13.8 us vs cuBLAS 15.4-15.7 (also the best in the step)
    (4096, 4096): GemvConfig(8, 1024, 1, 4),  # Qwen3-8B o_proj: alone 9.6 us (2 x 2048, 8 warps) vs cuBLAS 13.5-13.6
    (4096, 12288): GemvConfig(2, 2048, 1, 4),  # Qwen3-8B down: alone 25.2 us (4 x 1024) vs cuBLAS 29.5-29.7
    (5120, 6144): GemvConfig(8, 2048, 1, 8),  # Qwen3.5-27B linear-attention out_proj, attention o_proj: alone 16.7 (16 x 1024) vs 17.5
    (5120, 17408): GemvConfig(4, 2048, 1, 4),  # Qwen3.5-27B down: 42.8 vs 49.8-50.0 (also the best in the step)
    # SmolLM2-135M (the embedded default), bench/results/s18/gpu_gemv_smol.json: at these sizes a call
    # is latency, not bytes (0.16-0.9 us of them), and cuBLAS takes 3-5 us. Since stop 30 the configurations
    # fastest inside the graphed (folded) decode step: 1,900 -> 2,200 tokens/s together (bench/gemv_in_graph.py,
    # bench/results/s30/gemv_graph_smol/); alone (s18) 4 x 512 x 8w, 4 x 512 x 4w and 4 x 1024 x 8w were fastest
    (960, 576): GemvConfig(2, 1024, 1, 4),  # fused q/k/v: alone 2.05 us (4 x 512, 8 warps) vs cuBLAS 3.60
    (576, 576): GemvConfig(2, 1024, 1, 4),  # o_proj: alone 1.32 (4 x 512) vs 3.11
    (576, 1536): GemvConfig(4, 2048, 1, 8),  # down: alone 2.28 (4 x 1024, 8 warps) vs 4.73
}


# [2I, K] gate_up weight -> the SwiGLU GEMV's (block_n, block_k, 1, num_warps); block_n rows of gate
# and of up per program. Shapes not listed keep cuBLAS + silu_mul.
_TUNED_SWIGLU = {
    (24576, 4096): GemvConfig(2, 2048, 1, 4),  # Qwen3-8B gate_up: 47.3 us vs cuBLAS + silu_mul 50.6
    (34816, 5120): GemvConfig(2, 2048, 1, 4),  # Qwen3.5-27B gate_up: 79.1 vs 89.9 (bench/results/gpu_gemv_swiglu.json)
    (3072, 576): GemvConfig(2, 1024, 1, 4),  # SmolLM2-135M gate_up: 2.03 vs 5.92 (bench/results/s18/gpu_gemv_smol.json)
}
TUNED = GemvTables(_TUNED_LINEAR, _TUNED_SWIGLU)  # what every model runs with unless given others


def gemv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K] -> [M, N] in x.dtype (fp32 accumulation)."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, add_into: torch.Tensor | None = None):
    """y = x W^T (+ bias) for one row: x [1, K] (or [K]), weight [N, K] contiguous -> [1, N] (or [N]).
    With add_into ([1, N] or [N], x's dtype, contiguous): add_into += x W^T (+ bias) in place, one
    rounding after the add (addmm_ with beta = 1), returned: a folded layer's residual add in the epilogue."""
    if add_into is not None:
        _check_add_into(x, weight, add_into)
    if not (x.is_cuda or _interpreting()):
        if add_into is not None:  # fp32 product and add, one rounding (addmm_'s numerics, with the bias)
            y = F.linear(x.reshape(1, -1).float(), weight.float(), None if bias is None else bias.float())
            return add_into.copy_((add_into.float() + y.reshape(add_into.shape)).to(add_into.dtype))
        return gemv_reference(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    n, k = weight.shape
    if x.shape[-1] != k or x.dim() > 2 or x.numel() != k:
        raise ValueError(f"gemv: x must be [1, {k}] or [{k}], got {tuple(x.shape)}")
    if not weight.is_contiguous() or weight.device != x.device:
        raise ValueError("gemv: weight must be contiguous and on x's device")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"gemv: bias must be contiguous [{n}]")
    xv = x.reshape(k) if x.is_contiguous() else x.contiguous().reshape(k)
    cfg = config or gemv_config(n, k)
    n_blocks = triton.cdiv(n, cfg.block_n)
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k  # columns per split
    split = triton.cdiv(k, k_split)
    y = torch.empty(n, dtype=x.dtype, device=x.device) if add_into is None else add_into.view(n)
    if split > 1:
        partials = scratch("gemv.partials", x.device, split * n, torch.float32, minimum=1 << 20)
        tickets = scratch("gemv.tickets", x.device, n_blocks, torch.int32, minimum=1 << 16)
    else:
        partials, tickets = y, y  # unused
    _gemv_kernel[(n_blocks, split)](
        xv, weight, bias if bias is not None else weight, y, partials, tickets, n, y,
        K=k, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, K_SPLIT=k_split,
        num_warps=cfg.num_warps, ADD=add_into is not None, **pdl.kwargs(x),
    )
    if add_into is not None:
        return add_into
    return y.reshape(*x.shape[:-1], n)


def _check_add_into(x: torch.Tensor, weight: torch.Tensor, add_into: torch.Tensor) -> None:
    n = weight.shape[0]
    if (x.numel() != weight.shape[1] or add_into.numel() != n or not add_into.is_contiguous()
            or add_into.dtype != x.dtype or add_into.device != x.device):
        raise ValueError(f"gemv: add_into must be a contiguous [{n}] of x's dtype and device, for one row")


def gemv_swiglu_reference(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """x [M, K], gate_up [2I, K] -> silu(x G^T) * (x U^T) [M, I], each projection rounded to x.dtype first."""
    return silu_mul_ref(gemv_reference(x.reshape(-1, x.shape[-1]), gate_up))


def gemv_swiglu(x: torch.Tensor, gate_up: torch.Tensor, config: GemvConfig | None = None, rows: tuple | None = None):
    """The decode step's MLP input half in one launch: x [1, K], gate_up [2I, K] -> [1, I]. With
    rows = (x, eps) (the stream must be x itself): a folded norm, silu_mul's `rows` (gate and up times
    1 / rms(x) after their rounding)."""
    if rows is not None and (rows[0] is not x or x.numel() != gate_up.shape[1]):
        raise ValueError("gemv_swiglu: rows must be (x, eps) for one row x (the scale comes from x's pass)")
    if not (x.is_cuda or _interpreting()):
        if rows is not None:
            return silu_mul_ref(gemv_reference(x.reshape(1, -1), gate_up), (x.reshape(1, -1), rows[1])).reshape(*x.shape[:-1], -1)
        return gemv_swiglu_reference(x, gate_up)
    two_i, k = gate_up.shape
    if two_i % 2 or x.shape[-1] != k or x.dim() > 2 or x.numel() != k or not gate_up.is_contiguous():
        raise ValueError(f"gemv_swiglu: x [1, {k}] and a contiguous [2I, {k}] weight expected, got {tuple(x.shape)}")
    x = x.reshape(k).contiguous()
    eps = rows[1] if rows is not None else 0.0
    cfg = config or TUNED.swiglu.get((two_i, k)) or GemvConfig(4, 1024, 1, 4)
    if cfg.split_k != 1:
        raise ValueError("gemv_swiglu: split_k must be 1")
    i = two_i // 2
    y = torch.empty(1, i, dtype=x.dtype, device=x.device)
    _gemv_swiglu_kernel[(triton.cdiv(i, cfg.block_n),)](x, gate_up, y, i, eps, K=k,
                                                        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                        STEPS=triton.cdiv(k, cfg.block_k), num_warps=cfg.num_warps,
                                                        FOLD=rows is not None, **pdl.kwargs(x))
    return y
