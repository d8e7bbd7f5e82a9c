"""Linear layers for few rows (decode and tree verify) with the layer's neighbours fused in, beside
the plain-torch reference.

At batch 1 a decoder layer reads its weights once per step, and the small kernels around its
GEMVs (the RMSNorm before a projection, the residual add after one, SwiGLU between gate/up and
down) cost a launch and a round trip each. This kernel folds them into the GEMV:

    y = [norm](x) @ W^T [+ b]      then   [swiglu]   then   [+ residual]

- norm (prologue): RMSNorm of each row of x with weight w (1 + w with unit_offset). The kernel
  multiplies x by w on the fly and the row's 1/rms (accumulated in the same pass over K) after
  the dot: y = rstd * ((x * w) @ W^T). No pre-pass over x.
- swiglu (epilogue): W is [2I, K] (gate rows, then up rows); each program reads the gate and up
  rows of its I-columns and writes silu(g) * u: [M, I]. Replaces gate_up -> silu_mul.
- residual (epilogue): y + residual, rounded once more to the model dtype: the residual stream.

Roundings follow the unfused layer: the GEMV's output is rounded to the model dtype before the
SwiGLU or the residual add, which are computed in fp32. The one difference is the normalized
input: the unfused path rounds x * rstd * w to the model dtype, this one rounds x * w (rstd
multiplies the fp32 dot): the same precision, other bits.

Program (n-tile, m-tile) computes BLOCK_M rows x BLOCK_N outputs with tl.dot over K in
BLOCK_K chunks (a decode step's single row pads to 16 rows; the GEMV is bound by the weight
bytes, not by the tensor cores). No split-K: every output is one program's sum, in a fixed
order, so a row's result does not depend on which other rows share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from treeflash.kernels.pointwise.norm import _interpreting


def linear_fused_ref(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K] ([2I, K] with swiglu)
    bias: torch.Tensor | None = None,  # [N]
    norm_weight: torch.Tensor | None = None,  # [K]
    eps: float = 1e-6,
    unit_offset: bool = False,
    residual: torch.Tensor | None = None,  # [M, N'] (N' = N, or I with swiglu)
    swiglu: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [M, N']
    dtype = out_dtype or x.dtype
    xf = x.float()
    rstd = None
    if norm_weight is not None:
        w = norm_weight.float() + 1.0 if unit_offset else norm_weight.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        xf = (xf * w).to(weight.dtype).float()
    else:
        xf = xf.to(weight.dtype).float()
    y = xf @ weight.float().t()
    if rstd is not None:
        y = y * rstd
    if bias is not None:
        y = y + bias.float()
    if swiglu:
        g, u = y.to(dtype).float().chunk(2, dim=-1)
        y = torch.nn.functional.silu(g) * u
    if residual is not None:
        y = y.to(dtype).float() + residual.float()
    return y.to(dtype)


@triton.jit
def _dot_t(a, b, DOT: tl.constexpr):
    """a [M, K] @ b[N, K]^T in fp32 (ieee for fp32 inputs: no TF32)."""
    if DOT == tl.float32:  # fp32 weights, or bf16/fp16 ones under the interpreter (exact products)
        out = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    else:
        out = tl.dot(a.to(DOT), tl.trans(b.to(DOT)))
    return out


@triton.jit
def _norm_weight(NW, k, k_ok, UNIT: tl.constexpr):
    """The RMSNorm weight over columns k (1 + w with unit_offset), fp32."""
    nw = tl.load(NW + k, mask=k_ok, other=0.0).to(tl.float32)
    if UNIT:
        nw = nw + 1.0
    return nw


@triton.jit
def _epilogue(acc, acc_u, ss, rows, cols, row_ok, col_ok, B, R, Y, N, stride_rm, stride_ym, eps,
              K: tl.constexpr, HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SWIGLU: tl.constexpr):
    """acc, acc_u: [BM, BN] fp32 dot products (acc_u: SwiGLU's up rows); ss: [BM] sums of x^2."""
    if HAS_NORM:
        rstd = tl.rsqrt(ss / K + eps)
        acc = acc * rstd[:, None]
        acc_u = acc_u * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            acc_u += tl.load(B + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_ty = Y.dtype.element_ty
    if SWIGLU:
        g = acc.to(out_ty).to(tl.float32)
        acc = g / (1.0 + tl.exp(-g)) * acc_u.to(out_ty).to(tl.float32)
    om = row_ok[:, None] & col_ok[None, :]
    if HAS_RES:
        acc = acc.to(out_ty).to(tl.float32) + tl.load(R + rows[:, None] * stride_rm + cols[None, :], mask=om, other=0.0).to(tl.float32)
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc.to(out_ty), mask=om)


@triton.jit
def _linear_kernel(
    X, W, NW, B, R, Y, M, N, stride_xm, stride_rm, stride_ym, eps,
    K: tl.constexpr, HAS_NORM: tl.constexpr, UNIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr, SWIGLU: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """tl.dot over [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles (any M; one row pads to 16)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    w_rows = cols.to(tl.int64) * K
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    ss = tl.zeros((BLOCK_M,), tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + rows[:, None] * stride_xm + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        if HAS_NORM:
            ss += tl.sum(x * x, axis=1)
            x = x * _norm_weight(NW, k, k_ok, UNIT)[None, :]
        x = x.to(W.dtype.element_ty)  # the GEMV's input, rounded to the weight dtype
        wm = col_ok[:, None] & k_ok[None, :]
        w = tl.load(W + w_rows[:, None] + k[None, :], mask=wm, other=0.0)
        acc += _dot_t(x, w, DOT)
        if SWIGLU:
            wu = tl.load(W + (w_rows + N * K)[:, None] + k[None, :], mask=wm, other=0.0)
            acc_u += _dot_t(x, wu, DOT)
    _epilogue(acc, acc_u, ss, rows, cols, row_ok, col_ok, B, R, Y, N, stride_rm, stride_ym, eps,
              K, HAS_NORM, HAS_BIAS, HAS_RES, SWIGLU)


@triton.jit
def _gemv_kernel(
    X, W, NW, B, R, Y, M, N, stride_xm, stride_rm, stride_ym, eps,
    K: tl.constexpr, HAS_NORM: tl.constexpr, UNIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr, SWIGLU: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One row (M == 1) with fp32 multiply-adds on CUDA cores: [BLOCK_N, BLOCK_K] partial sums in
    registers, reduced over K once at the end."""
    pid_n = tl.program_id(0)
    rows = tl.arange(0, 1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    w_rows = cols.to(tl.int64) * K
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc2_u = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    ss2 = tl.zeros((BLOCK_K,), tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(X + k, mask=k_ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            ss2 += x * x
            x = x * _norm_weight(NW, k, k_ok, UNIT)
        x = x.to(W.dtype.element_ty).to(tl.float32)
        wm = col_ok[:, None] & k_ok[None, :]
        w = tl.load(W + w_rows[:, None] + k[None, :], mask=wm, other=0.0)
        acc2 += w.to(tl.float32) * x[None, :]
        if SWIGLU:
            wu = tl.load(W + (w_rows + N * K)[:, None] + k[None, :], mask=wm, other=0.0)
            acc2_u += wu.to(tl.float32) * x[None, :]
    acc = tl.sum(acc2, axis=1)[None, :]
    acc_u = tl.sum(acc2_u, axis=1)[None, :]
    ss = tl.sum(ss2, axis=0) + tl.zeros((1,), tl.float32)
    _epilogue(acc, acc_u, ss, rows, cols, row_ok, col_ok, B, R, Y, N, stride_rm, stride_ym, eps,
              K, HAS_NORM, HAS_BIAS, HAS_RES, SWIGLU)


@dataclass(frozen=True)
class LinearConfig:
    block_m: int  # rows per program (tl.dot: >= 16)
    block_n: int  # output columns per program
    block_k: int  # K per loop step
    num_warps: int
    num_stages: int
    fma: bool = False  # one row: _gemv_kernel (CUDA-core multiply-adds) instead of tl.dot


def linear_config(m: int, n: int, k: int, swiglu: bool = False) -> LinearConfig:
    """The fixed launch configuration for an [m, k] x [n, k]^T product (no autotuning): the best
    of the H200 sweeps (bench/gpu_linear.py; bench/results/linear_probe/): one row on CUDA cores,
    16 outputs x 512 K per step, 8 warps (the best for every narrow projection, each weight read
    from memory); SwiGLU's paired gate/up rows through tl.dot 16 x 64 x 128; verify batches
    through tl.dot with 32 outputs x 128 K. None of these beats cuBLAS by much: see
    docs/performance.md before turning the fused layers on."""
    if m == 1 and not swiglu:
        return LinearConfig(1, 16, 512 if k >= 512 else max(16, triton.next_power_of_2(k)), 8, 3, fma=True)
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    if m <= 64 and (2 if swiglu else 1) * n * k * 2 <= SMALL_WEIGHT_BYTES:
        # small weights (SmolLM2's), verify batches: many narrow programs, short K steps, deep pipelines.
        # H200, 33 rows, weights from memory (bench/results/s22/gpu_linear_smol_cold.json), with the fused
        # norm / SwiGLU / residual: o 3.9 us, gate/up 4.6, down 6.6, against 4.1 / 5.2 / 7.2 for the
        # 32 x 128 tiles below; still behind cuBLAS (3.6 / 4.2 / 5.0), so FUSED_ROWS stays 0
        return LinearConfig(block_m, 16, 64 if k <= 1024 else 128, 4, 4 if k <= 1024 else 3)
    block_n = 64 if swiglu and m == 1 else 32
    return LinearConfig(block_m, block_n, 128 if k >= 128 else max(16, triton.next_power_of_2(k)), 4, 3)


SMALL_WEIGHT_BYTES = 8 << 20
_DOT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def linear_fused(
    x: torch.Tensor,  # [M, K] (row stride free, last dim contiguous)
    weight: torch.Tensor,  # [N, K] contiguous ([2I, K] with swiglu)
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    unit_offset: bool = False,
    residual: torch.Tensor | None = None,  # [M, N'] last dim contiguous
    swiglu: bool = False,
    out_dtype: torch.dtype | None = None,
    config: LinearConfig | None = None,
) -> torch.Tensor:  # [M, N'] in out_dtype (default x.dtype)
    """Triton on CUDA (or under TRITON_INTERPRET), the reference elsewhere."""
    if not (x.is_cuda or _interpreting()):
        return linear_fused_ref(x, weight, bias, norm_weight, eps, unit_offset, residual, swiglu, out_dtype)
    m, k = x.shape
    n_w = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous() or x.stride(1) != 1:
        raise ValueError(f"linear_fused: x [M, K] with a contiguous last dim and a contiguous weight [N, K]; "
                         f"got x {tuple(x.shape)}/{x.stride()}, weight {tuple(weight.shape)}")
    if swiglu and n_w % 2:
        raise ValueError(f"linear_fused: swiglu needs an even number of weight rows, got {n_w}")
    n = n_w // 2 if swiglu else n_w
    if residual is not None and (tuple(residual.shape) != (m, n) or residual.stride(1) != 1):
        raise ValueError(f"linear_fused: residual must be [{m}, {n}] with a contiguous last dim, got {tuple(residual.shape)}")
    dtype = out_dtype or x.dtype
    y = torch.empty(m, n, dtype=dtype, device=x.device)
    cfg = config or linear_config(m, n, k, swiglu)
    if cfg.fma and m == 1:
        _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
            x, weight, norm_weight if norm_weight is not None else weight, bias if bias is not None else weight,
            residual if residual is not None else y, y, m, n, x.stride(0),
            residual.stride(0) if residual is not None else 0, y.stride(0), eps,
            K=k, HAS_NORM=norm_weight is not None, UNIT=unit_offset, HAS_BIAS=bias is not None,
            HAS_RES=residual is not None, SWIGLU=swiglu, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return y
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _linear_kernel[grid](
        x, weight, norm_weight if norm_weight is not None else weight, bias if bias is not None else weight,
        residual if residual is not None else y, y, m, n, x.stride(0),
        residual.stride(0) if residual is not None else 0, y.stride(0), eps,
        K=k, HAS_NORM=norm_weight is not None, UNIT=unit_offset, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None, SWIGLU=swiglu, DOT=tl.float32 if _interpreting() else _DOT[weight.dtype],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
