"""Fused per-head RMSNorm (qwen3 / qwen3_5 q_norm and k_norm) + rotary embedding (rotate-half
layout, partial rotary: only the first `rotary_dim` dims turn), beside the plain-torch reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.norm import _interpreting


def norm_rotary_ref(x, cos, sin, weight, eps: float, unit_offset: bool):
    """x: [T, H, D] (any strides), cos/sin: [T, rd], weight: [D] or None -> [T, H, D]."""
    xf = x.float()
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
def _norm_rotary_kernel(X, C, S, W, Y, sxt, sxh, H, eps, HAS_NORM: tl.constexpr, UNIT: tl.constexpr,
                        D: tl.constexpr, HALF: tl.constexpr, REST: tl.constexpr, REST_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // H
    h = pid % H
    base = X + t * sxt + h * sxh
    i = tl.arange(0, HALF)
    x1 = tl.load(base + i).to(tl.float32)
    x2 = tl.load(base + HALF + i).to(tl.float32)
    j = tl.arange(0, REST_BLOCK)
    mr = j < REST
    x3 = tl.load(base + 2 * HALF + j, mask=mr, other=0.0).to(tl.float32)
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
    out = Y + (t * H + h) * D
    tl.store(out + i, (x1 * c1 - x2 * s1).to(Y.dtype.element_ty))
    tl.store(out + HALF + i, (x2 * c2 + x1 * s2).to(Y.dtype.element_ty))
    tl.store(out + 2 * HALF + j, x3.to(Y.dtype.element_ty), mask=mr)


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
