"""Fused per-head RMSNorm (qwen3 / qwen3_5 q_norm and k_norm) + rotary embedding (rotate-half
layout, partial rotary: only the first `rotary_dim` dims turn), beside the plain-torch reference.

norm_rotary_into_cache may also apply the layer's input RMSNorm after the fact: with `rows` =
(stream [T, hidden], eps), q, k and v were projected from the raw residual stream by weights with
the norm's scale folded in (models.transformer's folded layers), and each token's values are first
multiplied by its 1 / rms(stream[t]) (computed here: no norm launch before the projection)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl

from treeflash.kernels.pointwise.norm import _interpreting, row_rsqrt, row_scale_ref, rows_args


def norm_rotary_ref(x, cos, sin, weight, eps: float, unit_offset: bool, pre: torch.Tensor | None = None):
    """x: [T, H, D] (any strides), cos/sin: [T, rd], weight: [D] or None, pre: [T] fp32 scale or
    None (applied first, in fp32) -> [T, H, D]."""
    xf = x.float()
    if pre is not None:
        xf = xf * pre[:, None, None]
    if weight is not None:
        w = weight.float() + 1.0 if unit_offset else weight.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w
    rd = cos.shape[-1]
    half = rd // 2
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    rot = xf[..., :rd]
    turned = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = torch.cat((rot * c + turned * s, xf[..., rd:]), dim=-1)
    return out.to(x.dtype)


@triton.jit
def _norm_rotary_head(base, C, S, W, out, t, eps, HAS_NORM: tl.constexpr, UNIT: tl.constexpr,
                      D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, REST_BLOCK: tl.constexpr, pre=1.0):
    """One head of token t: load D values at `base`, times `pre`, RMSNorm (optional), rotate the first
    2*HALF, store at `out`."""
    i = tl.arange(0, HALF)
    x1 = tl.load(base + i).to(tl.float32) * pre
    x2 = tl.load(base + HALF + i).to(tl.float32) * pre
    j = tl.arange(0, REST_BLOCK)
    mr = j < REST
    x3 = tl.load(base + 2 * HALF + j, mask=mr, other=0.0).to(tl.float32) * pre
    if HAS_NORM:
        var = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(x3 * x3, axis=0)) / D
        r = tl.rsqrt(var + eps)
        w1 = tl.load(W + i).to(tl.float32)
        w2 = tl.load(W + HALF + i).to(tl.float32)
        w3 = tl.load(W + 2 * HALF + j, mask=mr, other=0.0).to(tl.float32)
        if UNIT:
            w1, w2, w3 = w1 + 1.0, w2 + 1.0, w3 + 1.0
        x1, x2, x3 = x1 * r * w1, x2 * r * w2, x3 * r * w3
    c1 = tl.load(C + t * 2 * HALF + i).to(tl.float32)
    c2 = tl.load(C + t * 2 * HALF + HALF + i).to(tl.float32)
    s1 = tl.load(S + t * 2 * HALF + i).to(tl.float32)
    s2 = tl.load(S + t * 2 * HALF + HALF + i).to(tl.float32)
    tl.store(out + i, (x1 * c1 - x2 * s1).to(out.dtype.element_ty))
    tl.store(out + HALF + i, (x2 * c2 + x1 * s2).to(out.dtype.element_ty))
    tl.store(out + 2 * HALF + j, x3.to(out.dtype.element_ty), mask=mr)


@triton.jit
def _norm_rotary_kernel(X, C, S, W, Y, sxt, sxh, H, eps, HAS_NORM: tl.constexpr, UNIT: tl.constexpr,
                        D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, REST_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // H
    h = pid % H
    _norm_rotary_head(X + t * sxt + h * sxh, C, S, W, Y + (t * H + h) * D, t, eps, HAS_NORM, UNIT, D, HALF, REST, REST_BLOCK)


@triton.jit
def _rotary_cache_kernel(Q, K, V, C, S, QW, KW, QO, KC, VC, SLOT, ROWS, sqt, sqh, skt, skh, svt, svh, HQ, HKV, eps,
                         rows_eps, HAS_NORM: tl.constexpr, UNIT: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                         REST: tl.constexpr, REST_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr, N_ROWS: tl.constexpr = 0,
                         N_BLOCK: tl.constexpr = 16, PDL: tl.constexpr = False):
    # program (token t, head h): h < HQ a query head -> QO [T, HQ, D]; else KV head j = h - HQ:
    # its key (normed, rotated) and value go straight to the cache rows KC/VC [S, HKV, D] at SLOT[t].
    # N_ROWS > 0: everything first times 1 / rms(ROWS[t, :N_ROWS]) (the folded input norm)
    pdl.enter(PDL)
    pid = tl.program_id(0)
    t = pid // (HQ + HKV)
    h = pid % (HQ + HKV)
    pre = 1.0
    if N_ROWS > 0:
        pre = row_rsqrt(ROWS, t, rows_eps, N_ROWS, N_BLOCK)
    if h < HQ:
        _norm_rotary_head(Q + t * sqt + h * sqh, C, S, QW, QO + (t * HQ + h) * D, t, eps, HAS_NORM, UNIT, D, HALF, REST,
                          REST_BLOCK, pre)
    else:
        j = h - HQ
        row = (tl.load(SLOT + t).to(tl.int64) * HKV + j) * D
        _norm_rotary_head(K + t * skt + j * skh, C, S, KW, KC + row, t, eps, HAS_NORM, UNIT, D, HALF, REST, REST_BLOCK, pre)
        d = tl.arange(0, D_BLOCK)
        v = tl.load(V + t * svt + j * svh + d, mask=d < D).to(tl.float32) * pre
        tl.store(VC + row + d, v.to(VC.dtype.element_ty), mask=d < D)


def norm_rotary(x, cos, sin, weight, eps: float, unit_offset: bool):
    """Triton on CUDA (or TRITON_INTERPRET), the reference elsewhere. Returns a contiguous [T, H, D]."""
    if not (x.is_cuda or _interpreting()):
        return norm_rotary_ref(x, cos, sin, weight, eps, unit_offset)
    t, h, d = x.shape
    rd = cos.shape[-1]
    if x.stride(2) != 1 or cos.stride(1) != 1 or rd % 2 or rd > d:
        raise ValueError(f"norm_rotary: bad layout x{tuple(x.shape)}/{x.stride()} rotary_dim {rd}")
    half = rd // 2
    if half & (half - 1):
        raise ValueError(f"norm_rotary: rotary_dim/2 = {half} must be a power of two")
    y = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    rest = d - rd
    w = weight if weight is not None else cos
    _norm_rotary_kernel[(t * h,)](x, cos.contiguous(), sin.contiguous(), w, y, x.stride(0), x.stride(1), h, eps,
                                  HAS_NORM=weight is not None, UNIT=unit_offset, D=d, HALF=half, REST=rest,
                                  REST_BLOCK=max(triton.next_power_of_2(max(rest, 1)), 16))
    return y


def norm_rotary_into_cache_ref(q, k, v, cos, sin, q_weight, k_weight, eps: float, unit_offset: bool,
                               k_cache, v_cache, slots, rows=None):
    """q: [T, H, D], k, v: [T, Hkv, D] (any strides); k_cache, v_cache: [S, Hkv, D]; slots: [T] long;
    rows: None or (stream [T, N], eps): q, k, v first times row_scale_ref(stream, eps).
    Writes norm_rotary(k) and v to the cache rows at `slots`; returns norm_rotary(q) [T, H, D]."""
    pre = row_scale_ref(*rows) if rows is not None else None
    k_cache.index_copy_(0, slots, norm_rotary_ref(k, cos, sin, k_weight, eps, unit_offset, pre).to(k_cache.dtype))
    v_cache.index_copy_(0, slots, (v.float() * pre[:, None, None] if pre is not None else v).to(v_cache.dtype))
    return norm_rotary_ref(q, cos, sin, q_weight, eps, unit_offset, pre)


def norm_rotary_into_cache(q, k, v, cos, sin, q_weight, k_weight, eps: float, unit_offset: bool,
                           k_cache, v_cache, slots, rows=None):
    """One kernel for the query heads' norm + rotary and the new keys' and values' trip into a dense
    cache (replaces two norm_rotary launches and two index_copy_), and with `rows` the layer's input
    norm's 1 / rms (module docstring). Triton on CUDA (or under TRITON_INTERPRET), the reference elsewhere."""
    if not (q.is_cuda or _interpreting()):
        return norm_rotary_into_cache_ref(q, k, v, cos, sin, q_weight, k_weight, eps, unit_offset, k_cache, v_cache, slots, rows)
    t, hq, d = q.shape
    hkv = k.shape[1]
    rd = cos.shape[-1]
    half = rd // 2
    if (q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1 or rd % 2 or rd > d or half & (half - 1)
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[1:] != (hkv, d)):
        raise ValueError(f"norm_rotary_into_cache: bad layout q{tuple(q.shape)} k{tuple(k.shape)} cache{tuple(k_cache.shape)} rotary_dim {rd}")
    stream, rows_eps, n_rows, n_block = rows_args(rows, t, cos, "norm_rotary_into_cache")
    y = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    rest = d - rd
    _rotary_cache_kernel[(t * (hq + hkv),)](
        q, k, v, cos.contiguous(), sin.contiguous(), q_weight if q_weight is not None else cos,
        k_weight if k_weight is not None else cos, y, k_cache, v_cache, slots, stream,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), hq, hkv, eps, rows_eps,
        HAS_NORM=q_weight is not None, UNIT=unit_offset, D=d, HALF=half, REST=rest,
        REST_BLOCK=max(triton.next_power_of_2(max(rest, 1)), 16), D_BLOCK=triton.next_power_of_2(d),
        N_ROWS=n_rows, N_BLOCK=n_block, **pdl.kwargs(y),
    )
    return y
