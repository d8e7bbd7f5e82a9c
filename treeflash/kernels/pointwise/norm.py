"""Fused RMSNorm kernels (with residual add; with a SiLU gate), each beside its plain-torch reference.

rmsnorm:       s = x (+ residual);  y = s / rms(s) * w   (w -> 1 + w with unit_offset)
rmsnorm_gated: y = x / rms(x) * w * silu(gate)          (Gated DeltaNet output norm, per head)
Math in fp32, one rounding to the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl


def rmsnorm_ref(x, weight, eps: float, unit_offset: bool = False, residual=None):
    """x: [T, N] -> (y [T, N], s [T, N]) where s = x + residual (or x)."""
    s = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    sf = s.float()
    w = weight.float() + 1.0 if unit_offset else weight.float()
    y = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * w
    return y.to(x.dtype), s


def row_scale_ref(stream: torch.Tensor, eps: float) -> torch.Tensor:
    """stream [T, N] -> [T] fp32: 1 / rms of each row, as rmsnorm computes it (a folded norm's scale,
    applied after the projection: models.transformer's forward_folded)."""
    sf = stream.float()
    return torch.rsqrt(sf.pow(2).mean(-1) + eps)


def scale_rows(rows: tuple[torch.Tensor, float], *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each x [T, ...] times row_scale_ref(*rows) of its token, in fp32, back in x's dtype: the torch
    path of the folded norm where no kernel applies it."""
    pre = row_scale_ref(*rows)
    return tuple((x.float() * pre.view(-1, *([1] * (x.dim() - 1)))).to(x.dtype) for x in xs)


@triton.jit
def row_rsqrt(ROWS, t, eps, N: tl.constexpr, N_BLOCK: tl.constexpr):
    """row_scale_ref of row t of a contiguous [T, N] stream, as an fp32 scalar (inside a kernel)."""
    n = tl.arange(0, N_BLOCK)
    x = tl.load(ROWS + t * N + n, mask=n < N, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)


def rows_args(rows: tuple[torch.Tensor, float] | None, t: int, fallback: torch.Tensor, who: str) -> tuple:
    """A kernel's (stream, eps, N, N_BLOCK) for an optional folded norm `rows` over t tokens (N = 0:
    none; fallback is any tensor to pass as the unused pointer)."""
    if rows is None:
        return fallback, 0.0, 0, 16
    stream, eps = rows
    if not stream.is_contiguous() or stream.dim() != 2 or stream.shape[0] != t:
        raise ValueError(f"{who}: rows must be a contiguous [{t}, N] stream, got {tuple(stream.shape)}")
    return stream, eps, stream.shape[1], max(triton.next_power_of_2(stream.shape[1]), 16)


def rmsnorm_gated_ref(x, gate, weight, eps: float, out_dtype=None):
    """x, gate: [R, N] -> [R, N] in out_dtype (default x.dtype; x is first rounded to it)."""
    dtype = out_dtype or x.dtype
    xf = x.to(dtype).float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * torch.nn.functional.silu(gate.float())).to(dtype)


@triton.jit
def _rmsnorm_kernel(X, R, W, Y, S, sx, sr, N, eps, HAS_RES: tl.constexpr, UNIT: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * sx + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x = x + tl.load(R + row * sr + cols, mask=m, other=0.0).to(tl.float32)
        x = x.to(S.dtype.element_ty).to(tl.float32)  # the residual stream is kept in the model dtype
        tl.store(S + row * N + cols, x.to(S.dtype.element_ty), mask=m)
    var = tl.sum(x * x, axis=0) / N
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    if UNIT:
        w = w + 1.0
    y = x * tl.rsqrt(var + eps) * w
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _rmsnorm_gated_kernel(X, G, W, Y, sx, sg_outer, sg, GH, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Row r of x; its gate row is (r // GH, r % GH) of a gate [R / GH, GH, N] with strides (sg_outer, sg, 1)."""
    pdl.enter(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * sx + cols, mask=m, other=0.0).to(Y.dtype.element_ty).to(tl.float32)  # x in the output dtype
    g = tl.load(G + (row // GH) * sg_outer + (row % GH) * sg + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / N
    y = x * tl.rsqrt(var + eps) * w * (g / (1.0 + tl.exp(-g)))
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=m)


def _check_rows(name: str, *ts: torch.Tensor) -> None:
    for t in ts:
        if t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"{name}: expected 2-d row-major tensors, got shape {tuple(t.shape)} strides {t.stride()}")


def rmsnorm(x, weight, eps: float, unit_offset: bool = False, residual=None, out=None):
    """Triton on CUDA (or TRITON_INTERPRET), the reference elsewhere. x: [..., N]. `out`: a contiguous
    tensor of x's shape and dtype (e.g. rows of a larger buffer) that receives the normalized rows."""
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous()):
        raise ValueError(f"rmsnorm: out must be contiguous {tuple(x.shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    if not (x.is_cuda or _interpreting()):
        y, s = rmsnorm_ref(x, weight, eps, unit_offset, residual)
        return (y, s) if out is None else (out.copy_(y), s)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    r2 = residual.reshape(-1, shape[-1]) if residual is not None else x2
    _check_rows("rmsnorm", x2, r2)
    n = x2.shape[1]
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device) if out is None else out.view(x2.shape)
    s = torch.empty_like(y) if residual is not None else y
    block = triton.next_power_of_2(n)
    _rmsnorm_kernel[(x2.shape[0],)](x2, r2, weight, y, s, x2.stride(0), r2.stride(0), n, eps,
                                    HAS_RES=residual is not None, UNIT=unit_offset, BLOCK=block, num_warps=_row_warps(block),
                                    **pdl.kwargs(x))
    return y.view(shape), (s.view(shape) if residual is not None else x)


def rmsnorm_gated(x, gate, weight, eps: float, out_dtype=None):
    """x, gate: [..., N] -> [..., N]. out_dtype: the result's dtype (default x.dtype); an fp32 x (the
    recurrence's output) is rounded to it on load, as x.to(out_dtype) would, without a separate copy
    kernel. A 3-d gate [T, H, N] may be a strided view (the Gated DeltaNet's z, a slice of its input
    projection's rows): read in place, not copied."""
    if not (x.is_cuda or _interpreting()):
        return rmsnorm_gated_ref(x, gate, weight, eps, out_dtype)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if gate.shape != shape:
        raise ValueError(f"rmsnorm_gated: gate {tuple(gate.shape)} and x {tuple(shape)} differ")
    if gate.dim() == 3 and gate.stride(2) == 1:
        g2, gh, sg_outer, sg = gate, gate.shape[1], gate.stride(0), gate.stride(1)
    else:
        g2 = gate.reshape(-1, shape[-1])
        _check_rows("rmsnorm_gated", g2)
        gh, sg_outer, sg = 1, g2.stride(0), 0
    _check_rows("rmsnorm_gated", x2)
    y = torch.empty(x2.shape, dtype=out_dtype or x.dtype, device=x.device)
    n = x2.shape[1]
    _rmsnorm_gated_kernel[(x2.shape[0],)](x2, g2, weight, y, x2.stride(0), sg_outer, sg, gh, n, eps,
                                          BLOCK=triton.next_power_of_2(n), **pdl.kwargs(x))
    return y.view(shape)


def _row_warps(block: int) -> int:
    """Warps for one program over a row of `block` values: a decode step has one row, so the
    row's loads are all the parallelism there is (4 warps at 4-8K values left it latency-bound:
    3.3-4.2 us per call on the H200)."""
    return min(16, max(4, block // 512))


_INTERPRET = __import__("os").environ.get("TRITON_INTERPRET") == "1"


def _interpreting() -> bool:
    """Kernels also run on CPU tensors under the Triton interpreter (read once: set it before import)."""
    return _INTERPRET
