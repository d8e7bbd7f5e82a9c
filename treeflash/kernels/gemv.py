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

kernels/linear.py's one-row path (`_gemv_kernel`, inside `linear_fused`, off by default) is the
same idea with the RMSNorm / SwiGLU / residual fused in, but a rolled K loop without split-K; it
read 8B o_proj at 12.2 us where this kernel takes 9.6 (docs/performance.md). This one is the plain
projection that the decode step uses.

`gemv_reference` is the plain-torch contract (F.linear, fp32 accumulation); `gemv` runs the kernel
on CUDA or under TRITON_INTERPRET=1, the reference elsewhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels import pdl

from treeflash.kernels.activation import silu_mul_ref
from treeflash.kernels.gemv_rows import gemv_rows, gemv_swiglu_rows
from treeflash.kernels.norm import _interpreting, rmsnorm_ref
from treeflash.kernels.scratch import scratch


# kernels/projection.py's `linear` and `apply` send one-row projections of the TUNED shapes on
# CUDA through gemv: on by default (an H200: 8B decode 204 -> 217 tokens/s, 27B 70 -> 73;
# docs/performance.md); TREEFLASH_GEMV=0 keeps every projection on cuBLAS
USE_GEMV = os.environ.get("TREEFLASH_GEMV", "1") != "0"
# the residual add + RMSNorm after a decode step's o_proj / out_proj / down_proj as that GEMV's
# epilogue (`gemv_add_norm`, `projection.project(..., defer=True)`). Off: exact, but slower on the
# H200 (8B decode 218.4 -> 213.1-214.7 tokens/s: the last program's serial tail, ~5 us, costs more
# than the norm's own launch, 2.6 us; docs/performance.md). TREEFLASH_GEMV_NORM=1 turns it on.
NORM_EPILOGUE = os.environ.get("TREEFLASH_GEMV_NORM", "0") == "1"
# the residual add + RMSNorm before a decode step's fused qkv / in_proj / gate_up as that GEMV's
# prologue (`gemv_norm_in`, `projection.PendingNorm`): removes each norm's launch. Off until
# measured on the H200; TREEFLASH_GEMV_NORM_IN=1 turns it on for all three, =qkv for qkv / in_proj
# only (bench/gpu_speed.py --gemv-norm-in all|qkv). gate_up is separate: its many 2-row programs
# (6144 at the 8B shape) each read the row, and with the prologue the residual and the norm weight too.
_NORM_IN = os.environ.get("TREEFLASH_GEMV_NORM_IN", "0")
NORM_PROLOGUE = _NORM_IN in ("1", "all", "qkv")
NORM_PROLOGUE_SWIGLU = _NORM_IN in ("1", "all")
# up to this many rows (a verify step's nodes) take the GEMVs too (rows mode: `_gemv_rows_kernel`, SwiGLU
# included): each row's arithmetic is the one-row decode call's, bit for bit, so a
# verify pass projects exactly as plain decoding does (batch-invariant projections), and at the
# SmolLM2 shapes cuBLAS's 3-6 us per call is what verify spends most of its time on. 0 (the
# default) keeps multi-row projections on cuBLAS. TREEFLASH_GEMV_ROWS=32 turns it on.
# Measured on the H200 with one row per program (ROWS_GROUP 1): verify graphs 1.45 / 2.48 ms at 16 /
# 32 nodes against cuBLAS's 0.96 / 0.98 (docs/performance.md), each row re-reading the weight from L2.
ROWS_MAX = int(os.environ.get("TREEFLASH_GEMV_ROWS", "0"))
# rows per program in rows mode: a program reads its weight tile from L2 once and from L1 for the
# other rows of its group (not yet timed on the H200 for groups > 1; TREEFLASH_GEMV_ROWS_GROUP)
ROWS_GROUP = int(os.environ.get("TREEFLASH_GEMV_ROWS_GROUP", "8"))
# rows mode re-reads the weight once per group: only weights small enough to stay in L2 take it (the
# H200's L2 is 50 MB; SmolLM2's largest projection is 3.5 MB, an 8B down_proj 100 MB)
ROWS_WEIGHT_BYTES = 8 << 20


@triton.jit
def _add_norm_tail(Y, R, NW, S, YN, TA, N, eps, NUM_WRITERS: tl.constexpr, UNIT: tl.constexpr, BLOCK_FULL: tl.constexpr):
    """After this program stored its rows of y: the last of the NUM_WRITERS programs that write y
    (an atomic ticket) computes s = y + r and yn = rmsnorm(s) over the whole row, with the
    arithmetic of norm.py's _rmsnorm_kernel (s rounded to the model dtype, fp32 statistics)."""
    tl.debug_barrier()  # every thread's y stores come before this program's release
    done = tl.atomic_add(TA, 1, sem="acq_rel")
    if done == NUM_WRITERS - 1:
        cols = tl.arange(0, BLOCK_FULL)
        m = cols < N
        y = tl.load(Y + cols, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        h = y + tl.load(R + cols, mask=m, other=0.0).to(tl.float32)
        h = h.to(S.dtype.element_ty).to(tl.float32)  # the residual stream is kept in the model dtype
        tl.store(S + cols, h.to(S.dtype.element_ty), mask=m)
        var = tl.sum(h * h, axis=0) / N
        w = tl.load(NW + cols, mask=m, other=0.0).to(tl.float32)
        if UNIT:
            w = w + 1.0
        tl.store(YN + cols, (h * tl.rsqrt(var + eps) * w).to(YN.dtype.element_ty), mask=m)
        tl.atomic_xchg(TA, 0)  # ready for the next call (and the next CUDA-graph replay)


@triton.jit
def _norm_in_step(x, ss, R, NW, S, k, k_ok, write, UNIT: tl.constexpr):
    """One K step of a norm prologue: s = x + residual rounded to the stream's dtype (as the norm
    kernel keeps it), written out by the first n-block's program; returns (s * w, ss + s^2): the
    program's dot takes s * w, and 1 / rms(s) multiplies its result (a per-row constant)."""
    sv = (x + tl.load(R + k, mask=k_ok, other=0.0).to(tl.float32)).to(S.dtype.element_ty)
    tl.store(S + k, sv, mask=k_ok & write)
    sf = sv.to(tl.float32)
    wn = tl.load(NW + k, mask=k_ok, other=0.0).to(tl.float32)
    if UNIT:
        wn = wn + 1.0
    return sf * wn, ss + sf * sf


@triton.jit
def _gemv_kernel(
    X, W, B, Y, P, T, N,
    R, NW, S, YN, TA, eps,  # with NORM: residual in, norm weight, stream out, normed out, the ticket
    K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr,
    NORM: tl.constexpr = False, UNIT: tl.constexpr = False, N_BLOCKS: tl.constexpr = 1, BLOCK_FULL: tl.constexpr = 1,
    PDL: tl.constexpr = False, NORM_IN: tl.constexpr = False, ADD: tl.constexpr = False,
):
    """NORM_IN (split 1 only; R, NW, S, eps its residual, norm weight, stream out): x is the norm's
    input, not yet added: y = W rmsnorm(x + R) (see `gemv_norm_in`). ADD: y = W x + R, one rounding
    after the add (Y is R: the residual stream updated in place; see `gemv`'s add_into)."""
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
    ss = tl.zeros((BLOCK_K,), tl.float32)
    for i in tl.static_range(K_SPLIT // BLOCK_K):  # unrolled: every step's loads go out first
        k = s * K_SPLIT + i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + k, mask=k_ok, other=0.0).to(tl.float32)
        if NORM_IN:
            x, ss = _norm_in_step(x, ss, R, NW, S, k, k_ok, pid_n == 0, UNIT)
        if i == 0:
            w = w0
        else:
            w = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    part = tl.sum(acc, axis=1)  # [BLOCK_N]
    if NORM_IN:
        part = part * tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    if SPLIT_K == 1:
        if HAS_BIAS:
            part += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
        if ADD:  # this program's rows of the stream: read, then overwritten by the same program
            part += tl.load(R + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(Y + rows, part.to(Y.dtype.element_ty), mask=row_ok)
        if NORM:
            _add_norm_tail(Y, R, NW, S, YN, TA, N, eps, N_BLOCKS, UNIT, BLOCK_FULL)
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
            if NORM:
                _add_norm_tail(Y, R, NW, S, YN, TA, N, eps, N_BLOCKS, UNIT, BLOCK_FULL)


@triton.jit
def _gemv_swiglu_kernel(X, W, Y, I, R, NW, S, eps, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        STEPS: tl.constexpr, PDL: tl.constexpr = False, NORM_IN: tl.constexpr = False,
                        UNIT: tl.constexpr = False, FOLD: tl.constexpr = False):
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
        if NORM_IN:
            x, ss = _norm_in_step(x, ss, R, NW, S, k, k_ok, pid == 0, UNIT)
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
    if NORM_IN:
        r = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        g, u = g * r, u * r
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
    return TUNED.get((n, k)) or GemvConfig(block_n=8, block_k=512, split_k=1 if k <= 4096 else 2, num_warps=4)


# (N, K) -> the fastest configuration of an H200 sweep where it beats cuBLAS (bench/gpu_gemv.py;
# bench/results/gpu_gemv*.json, us per call with every weight byte from memory).
# `projection.linear` and `apply` use gemv only for these shapes; every other one stays on cuBLAS (e.g. gate/up, 96-99% of
# the bandwidth there already).
# Since stop 30 the Qwen3-8B o_proj / down and Qwen3.5-27B (5120, 6144) entries are the fastest inside the whole graphed
# decode step (bench/gemv_in_graph.py; bench/results/s30/gemv_graph_*): alone, 2 x 2048 o_proj and 4 x 1024 down
# were faster, in the step they were not (8B pipelined 229.9 -> 238.2 tokens/s; 27B 75.9 -> 77.2)
TUNED: dict[tuple[int, int], GemvConfig] = {  # bench/results/gpu_gemv.json (wide grid), gpu_gemv_focus.json
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


# (N, K) -> the configuration with a norm prologue where TUNED's would spill: the prologue's extra
# loads on top of TUNED's 8 x 1024 x 4-warp qkv tile spill 452 bytes in an offline sm_90a compile
# (ptxas -v); 8 warps hold it in 219 registers (H200 sweep without the prologue: 15.0 us vs 13.8)
TUNED_NORM_IN: dict[tuple[int, int], GemvConfig] = {
    (6144, 4096): GemvConfig(8, 1024, 1, 8),
}


# [2I, K] gate_up weight -> the SwiGLU GEMV's (block_n, block_k, 1, num_warps); block_n rows of gate
# and of up per program. Shapes not listed keep cuBLAS + silu_mul.
TUNED_SWIGLU: dict[tuple[int, int], GemvConfig] = {
    (24576, 4096): GemvConfig(2, 2048, 1, 4),  # Qwen3-8B gate_up: 47.3 us vs cuBLAS + silu_mul 50.6
    (34816, 5120): GemvConfig(2, 2048, 1, 4),  # Qwen3.5-27B gate_up: 79.1 vs 89.9 (bench/results/gpu_gemv_swiglu.json)
    (3072, 576): GemvConfig(2, 1024, 1, 4),  # SmolLM2-135M gate_up: 2.03 vs 5.92 (bench/results/s18/gpu_gemv_smol.json)
}


def load_table(path: str, margin: float = 0.98) -> dict[str, str]:
    """Replace TUNED's (TUNED_SWIGLU's, for SwiGLU runs) entries with a sweep's results (bench/gpu_gemv.py JSON): per projection, its
    fastest configuration if that takes under `margin` x cuBLAS's time, else cuBLAS. Returns what
    was chosen, by (N, K)."""
    import json

    chosen = {}
    for run in json.loads(open(path).read())["runs"]:
        n, k = run["N"], run["K"]
        table = TUNED_SWIGLU if run.get("swiglu") else TUNED
        timed = {name.split(" ")[0]: v["us"] for name, v in run.items()
                 if isinstance(v, dict) and "us" in v and name != "cublas" and v.get("repeatable", True)}
        best = min(timed, key=timed.get) if timed else None
        if best is not None and timed[best] < margin * run["cublas"]["us"]:
            bn, bk, sk, w = (int(part[1:]) for part in best.split("_"))
            table[(n, k)] = GemvConfig(bn, bk, sk, w)
            chosen[f"{n}x{k}" + (" swiglu" if run.get("swiglu") else "")] = f"{best} {timed[best]:.1f} us vs cublas {run['cublas']['us']:.1f}"
        else:
            table.pop((n, k), None)
            chosen[f"{n}x{k}" + (" swiglu" if run.get("swiglu") else "")] = f"cublas {run['cublas']['us']:.1f} us"
    return chosen


def gemv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K], weight [N, K] -> [M, N] in x.dtype (fp32 accumulation)."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def _norm_stream(name: str, residual: torch.Tensor, norm_weight: torch.Tensor, width: int, x: torch.Tensor) -> torch.Tensor:
    """A fused norm's inputs checked (a contiguous residual of `width` values, a [width] weight);
    returns the buffer its stream (x + residual) is written to."""
    if residual.numel() != width or not residual.is_contiguous() or norm_weight.shape != (width,):
        raise ValueError(f"{name}: residual must be contiguous with {width} values and the norm weight [{width}]")
    return torch.empty(width, dtype=x.dtype, device=x.device)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, norm: tuple | None = None, norm_in: tuple | None = None,
         add_into: torch.Tensor | None = None):
    """y = x W^T (+ bias) for one row: x [1, K] (or [K]), weight [N, K] contiguous -> [1, N] (or [N]).
    x [M, K] (rows mode: no norm, no split-K): M one-row calls in one launch, each row bit for bit
    what gemv(x[i:i + 1]) gives.
    With norm = (residual, norm_weight, eps, unit_offset): (rmsnorm(y + residual), y + residual),
    the add and norm in the launch's last program (see `gemv_add_norm`). With norm_in = (residual
    [K], norm_weight [K], eps, unit_offset): (rmsnorm(x + residual) W^T, x + residual), the add and
    norm as the prologue (see `gemv_norm_in`). With add_into ([1, N] or [N], x's dtype, contiguous):
    add_into += x W^T (+ bias) in place, one rounding after the add (addmm_ with beta = 1, as
    gemm_pdl.gemm_ref), returned: a folded layer's residual add in the epilogue."""
    if add_into is not None:
        _check_add_into(x, weight, add_into, norm is not None or norm_in is not None)
    if not (x.is_cuda or _interpreting()):
        if add_into is not None:  # fp32 product and add, one rounding (gemm_pdl.gemm_ref's numerics, with the bias)
            y = F.linear(x.reshape(1, -1).float(), weight.float(), None if bias is None else bias.float())
            return add_into.copy_((add_into.float() + y.reshape(add_into.shape)).to(add_into.dtype))
        if norm is not None:
            return gemv_add_norm_reference(x, weight, *norm, bias=bias)
        if norm_in is not None:
            return gemv_norm_in_reference(x, weight, *norm_in, bias=bias)
        return gemv_reference(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    n, k = weight.shape
    m_rows = x.shape[0] if x.dim() == 2 else 1
    if x.shape[-1] != k or x.dim() > 2 or m_rows < 1:
        raise ValueError(f"gemv: x must be [M, {k}] or [{k}], got {tuple(x.shape)}")
    if m_rows > 1 and (norm is not None or norm_in is not None):
        raise ValueError("gemv: a norm epilogue or prologue takes one row")
    if not weight.is_contiguous() or weight.device != x.device:
        raise ValueError("gemv: weight must be contiguous and on x's device")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"gemv: bias must be contiguous [{n}]")
    xv = x.reshape(m_rows * k) if x.is_contiguous() else x.contiguous().reshape(m_rows * k)
    cfg = config or gemv_config(n, k)
    n_blocks = triton.cdiv(n, cfg.block_n)
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k  # columns per split
    split = triton.cdiv(k, k_split)
    if m_rows > 1 and split > 1:
        raise ValueError("gemv: several rows need a configuration without split-K")
    y = torch.empty(m_rows * n, dtype=x.dtype, device=x.device)
    if m_rows > 1:
        return gemv_rows(xv, weight, bias, y, m_rows, cfg, ROWS_GROUP).reshape(m_rows, n)
    if split > 1:
        partials = scratch("gemv.partials", x.device, split * n, torch.float32, minimum=1 << 20)
        tickets = scratch("gemv.tickets", x.device, n_blocks, torch.int32, minimum=1 << 16)
    else:
        partials, tickets = y, y  # unused
    if norm is not None and norm_in is not None:
        raise ValueError("gemv: a norm epilogue or a norm prologue, not both")
    if norm_in is not None:
        residual, norm_weight, eps, unit_offset = norm_in
        if split > 1:
            raise ValueError("gemv_norm_in: configurations without split-K only (every program needs the whole row)")
        stream = _norm_stream("gemv_norm_in", residual, norm_weight, k, x)
        normed = ticket = y
    elif norm is None:  # the NORM arguments are unused (ADD: the residual is the output itself)
        if add_into is not None:
            y = add_into.view(n)
        residual = norm_weight = stream = normed = ticket = y
        eps, unit_offset = 0.0, False
    else:
        residual, norm_weight, eps, unit_offset = norm
        stream, normed = _norm_stream("gemv_add_norm", residual, norm_weight, n, x), torch.empty_like(y)
        ticket = scratch("gemv.norm_ticket", x.device, 1, torch.int32, minimum=16)
    _gemv_kernel[(n_blocks, split)](
        xv, weight, bias if bias is not None else weight, y, partials, tickets, n,
        residual, norm_weight, stream, normed, ticket, eps,
        K=k, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, K_SPLIT=k_split,
        NORM=norm is not None, UNIT=unit_offset, N_BLOCKS=n_blocks if norm is not None else 1,
        BLOCK_FULL=triton.next_power_of_2(n) if norm is not None else 1, num_warps=cfg.num_warps,
        NORM_IN=norm_in is not None, ADD=add_into is not None, **pdl.kwargs(x),
    )
    if add_into is not None:
        return add_into
    if norm_in is not None:
        return y.reshape(*x.shape[:-1], n), stream.reshape(x.shape)
    if norm is None:
        return y.reshape(*x.shape[:-1], n)
    return normed.reshape(*x.shape[:-1], n), stream.reshape(*x.shape[:-1], n)


def _check_add_into(x: torch.Tensor, weight: torch.Tensor, add_into: torch.Tensor, fused_norm: bool) -> None:
    n = weight.shape[0]
    if (fused_norm or x.numel() != weight.shape[1] or add_into.numel() != n or not add_into.is_contiguous()
            or add_into.dtype != x.dtype or add_into.device != x.device):
        raise ValueError(f"gemv: add_into must be a contiguous [{n}] of x's dtype and device, for one row without a fused norm")


def gemv_add_norm_reference(x, weight, residual, norm_weight, eps: float, unit_offset: bool, bias=None):
    """(rmsnorm(x W^T + residual), x W^T + residual): the projection rounded to x.dtype, then
    norm.py's fused add + RMSNorm."""
    y = gemv_reference(x.reshape(1, -1), weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    return rmsnorm_ref(y, norm_weight, eps, unit_offset, residual.reshape(y.shape))


def gemv_add_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                  eps: float, unit_offset: bool = False, config: GemvConfig | None = None):
    """One launch for a decode step's "projection, residual add, RMSNorm": x [1, K], weight [N, K],
    residual [1, N] -> (normed [1, N], stream = y + residual [1, N]). The programs write y as gemv
    does; the last of them to finish (a ticket) adds the residual and norms the whole row. Saves
    the norm's own launch (2.6 us on the H200 for one 4096-wide row) for a ~1 us tail."""
    return gemv(x, weight, config=config, norm=(residual, norm_weight, eps, unit_offset))


def gemv_norm_in_reference(x, weight, residual, norm_weight, eps: float, unit_offset: bool, bias=None):
    """(rmsnorm(x + residual) W^T, x + residual): norm.py's fused add + RMSNorm, then the projection."""
    normed, stream = rmsnorm_ref(x.reshape(1, -1), norm_weight, eps, unit_offset, residual.reshape(1, -1))
    y = gemv_reference(normed, weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    return y, stream.reshape(x.shape)


def gemv_norm_in(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float, unit_offset: bool = False, bias: torch.Tensor | None = None, config: GemvConfig | None = None):
    """One launch for a decode step's "residual add, RMSNorm, projection": x, residual [1, K],
    weight [N, K] -> (y [1, N], stream = x + residual [1, K]). Every program adds and squares the
    row as it streams it (the sum of squares beside the dot), multiplies each value by the norm
    weight before the dot, and scales its dot by 1 / rms at the end; the first n-block writes the
    stream. Removes the norm's launch; the normed row is not rounded to x.dtype before the dot (the
    unfused path rounds it), so bf16 results differ from that path by that rounding."""
    return gemv(x, weight, bias, config=config, norm_in=(residual, norm_weight, eps, unit_offset))


def gemv_swiglu_reference(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """x [M, K], gate_up [2I, K] -> silu(x G^T) * (x U^T) [M, I], each projection rounded to x.dtype first."""
    return silu_mul_ref(gemv_reference(x.reshape(-1, x.shape[-1]), gate_up))


def gemv_swiglu(x: torch.Tensor, gate_up: torch.Tensor, config: GemvConfig | None = None, norm_in: tuple | None = None,
                rows: tuple | None = None):
    """The decode step's MLP input half in one launch: x [1, K], gate_up [2I, K] -> [1, I] (x [M, K]
    without norm_in: M rows, each as its one-row call, -> [M, I]). With
    norm_in = (residual, norm_weight, eps, unit_offset): the add and RMSNorm before it as the
    prologue, as in `gemv_norm_in` -> (y, stream). With rows = (x, eps) (one row; the stream must be
    x itself): a folded norm, silu_mul's `rows` (gate and up times 1 / rms(x) after their rounding)."""
    if rows is not None and (rows[0] is not x or x.numel() != gate_up.shape[1] or norm_in is not None):
        raise ValueError("gemv_swiglu: rows must be (x, eps) for one row x without norm_in (the scale comes from x's pass)")
    if not (x.is_cuda or _interpreting()):
        if rows is not None:
            return silu_mul_ref(gemv_reference(x.reshape(1, -1), gate_up), (x.reshape(1, -1), rows[1])).reshape(*x.shape[:-1], -1)
        if norm_in is not None:
            normed, stream = rmsnorm_ref(x.reshape(1, -1), norm_in[1], norm_in[2], norm_in[3], norm_in[0].reshape(1, -1))
            return gemv_swiglu_reference(normed, gate_up), stream.reshape(x.shape)
        return gemv_swiglu_reference(x, gate_up)
    two_i, k = gate_up.shape
    m_rows = x.numel() // k if x.dim() == 2 else 1
    if two_i % 2 or x.shape[-1] != k or x.dim() > 2 or not gate_up.is_contiguous() or (m_rows > 1 and norm_in is not None):
        raise ValueError(f"gemv_swiglu: x [M, {k}] (one row with norm_in) and a contiguous [2I, {k}] weight expected, "
                         f"got {tuple(x.shape)}")
    shape = x.shape
    x = x.reshape(m_rows * k).contiguous()
    if norm_in is not None:
        residual, norm_weight, eps, unit_offset = norm_in
        stream = _norm_stream("gemv_swiglu", residual, norm_weight, k, x)
    else:
        residual = norm_weight = stream = x
        eps, unit_offset = (rows[1] if rows is not None else 0.0), False
    cfg = config or TUNED_SWIGLU.get((two_i, k)) or GemvConfig(4, 1024, 1, 4)
    if cfg.split_k != 1:
        raise ValueError("gemv_swiglu: split_k must be 1")
    i = two_i // 2
    y = torch.empty(m_rows, i, dtype=x.dtype, device=x.device)
    if m_rows > 1:
        return gemv_swiglu_rows(x, gate_up, y, m_rows, cfg, ROWS_GROUP)
    _gemv_swiglu_kernel[(triton.cdiv(i, cfg.block_n),)](x, gate_up, y, i, residual, norm_weight, stream, eps, K=k,
                                                        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                        STEPS=triton.cdiv(k, cfg.block_k), num_warps=cfg.num_warps,
                                                        NORM_IN=norm_in is not None, UNIT=unit_offset,
                                                        FOLD=rows is not None, **pdl.kwargs(x))
    if norm_in is not None:
        return y, stream.reshape(shape)
    return y
