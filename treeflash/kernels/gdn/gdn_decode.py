"""Gated DeltaNet decode (one token) as two fused kernels, beside their plain-torch references:

conv_step:      window <- [window[:, 1:], x];  y = silu(sum_k w[:, k] * [window, x][:, k])   (in place)
recurrent_step: per v head h (k head h // group): q, k = l2norm, q /= sqrt(Dk);
                g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b);
                S = e^g S;  S += k (beta (v - S^T k))^T;  o = S^T q                              (in place)

`_delta_step` is that step on one state tile; the tree verify and its commit (gdn_tree.py) reuse
it, so a committed path's state is computed by the same per-token code as plain decoding.

Measured and removed (docs/journal.md): both in one launch (an atomic ticket for the window shift),
5.1 against 4.9 us a layer on the H200.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl

from treeflash.kernels.pointwise.norm import _interpreting

STEP_BLOCK_V = 32  # v columns per program of a step (decode, and commit: same tiles, same rounding)


def conv_step_ref(x, window, weight):
    """x: [C] new input, window: [C, K-1] (updated in place), weight: [C, K] -> y: [C] fp32."""
    full = torch.cat((window, x[:, None].to(window.dtype)), dim=1).float()  # [C, K]
    y = F.silu((full * weight.float()).sum(-1))
    window.copy_(full[:, 1:].to(window.dtype))
    return y


def recurrent_step_ref(y, a, b, a_log, dt_bias, state, num_k_heads: int, k_dim: int, v_dim: int):
    """y: [2*Hk*Dk + Hv*Dv] fp32 conv output; a, b: [Hv]; state: [Hv, Dk, Dv] fp32 (in place) -> o [Hv, Dv] fp32."""
    hv = state.shape[0]
    key = num_k_heads * k_dim
    q, k, v = y[:key].view(num_k_heads, k_dim), y[key : 2 * key].view(num_k_heads, k_dim), y[2 * key :].view(hv, v_dim)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * k_dim**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = hv // num_k_heads
    q, k = q.repeat_interleave(group, 0), k.repeat_interleave(group, 0)
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    s = state * g.exp()[:, None, None]
    pred = torch.einsum("hkv,hk->hv", s, k)
    s = s + k[:, :, None] * (beta[:, None] * (v - pred))[:, None, :]
    state.copy_(s)
    return torch.einsum("hkv,hk->hv", s, q)


@triton.jit
def _conv_step_kernel(X, WIN, W, Y, C, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = c < C
    x = tl.load(X + c, mask=m, other=0.0)
    acc = x.to(tl.float32) * tl.load(W + c * K + (K - 1), mask=m, other=0.0).to(tl.float32)
    prev = x
    for j in tl.static_range(K - 1):  # walk the window from newest to oldest, shifting as we go
        col = K - 2 - j
        old = tl.load(WIN + c * (K - 1) + col, mask=m, other=0.0)
        acc += old.to(tl.float32) * tl.load(W + c * K + col, mask=m, other=0.0).to(tl.float32)
        tl.store(WIN + c * (K - 1) + col, prev.to(WIN.dtype.element_ty), mask=m)
        prev = old
    tl.store(Y + c, acc / (1.0 + tl.exp(-acc)), mask=m)


@triton.jit
def _delta_step(s, row, a, b, neg_a, dtb, h, ik, iv, GROUP: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr,
                DV: tl.constexpr):
    """One token on the state tile s [DK, BV] of v head h (columns iv): row points at the token's conv
    output (q | k | v), a and b are its gate inputs for head h, neg_a = -exp(A_log[h]).
    Returns (new tile, output [BV]). Decode, tree verify and commit all step through this."""
    kh = h // GROUP
    q = tl.load(row + kh * DK + ik)
    k = tl.load(row + HK * DK + kh * DK + ik)
    v = tl.load(row + 2 * HK * DK + h * DV + iv)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    x = a + dtb
    g = neg_a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    beta = 1.0 / (1.0 + tl.exp(-b))
    s = s * tl.exp(g)
    pred = tl.sum(s * k[:, None], axis=0)
    s = s + k[:, None] * (beta * (v - pred))[None, :]
    return s, tl.sum(s * q[:, None], axis=0)


@triton.jit
def _recurrent_step_kernel(Y, A, B, ALOG, DTB, S, O, GROUP: tl.constexpr, HK: tl.constexpr,
                           DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    h = tl.program_id(0)
    ik = tl.arange(0, DK)
    iv = tl.program_id(1) * BV + tl.arange(0, BV)
    ptr = S + h * DK * DV + ik[:, None] * DV + iv[None, :]
    neg_a = -tl.exp(tl.load(ALOG + h).to(tl.float32))
    a = tl.load(A + h).to(tl.float32)
    b = tl.load(B + h).to(tl.float32)
    s, o = _delta_step(tl.load(ptr), Y, a, b, neg_a, tl.load(DTB + h).to(tl.float32), h, ik, iv, GROUP, HK, DK, DV)
    tl.store(ptr, s)
    tl.store(O + h * DV + iv, o)


def conv_step(x, window, weight):
    if not (x.is_cuda or _interpreting()):
        return conv_step_ref(x, window, weight)
    c, k1 = window.shape
    if not (x.is_contiguous() and window.is_contiguous() and weight.is_contiguous()) or weight.shape != (c, k1 + 1):
        raise ValueError("conv_step: contiguous x [C], window [C, K-1], weight [C, K] expected")
    y = torch.empty(c, dtype=torch.float32, device=x.device)
    block = 512
    _conv_step_kernel[(triton.cdiv(c, block),)](x, window, weight, y, c, K=k1 + 1, BLOCK=block,
                                                **pdl.kwargs(y))
    return y


def recurrent_step(y, a, b, a_log, dt_bias, state, num_k_heads: int, k_dim: int, v_dim: int):
    if not (y.is_cuda or _interpreting()):
        return recurrent_step_ref(y, a, b, a_log, dt_bias, state, num_k_heads, k_dim, v_dim)
    hv = state.shape[0]
    if y.dtype != torch.float32 or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("recurrent_step: fp32 conv output and contiguous fp32 state expected")
    if state.shape != (hv, k_dim, v_dim) or y.shape[0] != 2 * num_k_heads * k_dim + hv * v_dim:
        raise ValueError(f"recurrent_step: shapes y{tuple(y.shape)} state{tuple(state.shape)} do not match")
    o = torch.empty(hv, v_dim, dtype=torch.float32, device=y.device)
    bv = min(STEP_BLOCK_V, v_dim)
    _recurrent_step_kernel[(hv, v_dim // bv)](y, a.contiguous(), b.contiguous(), a_log, dt_bias, state, o,
                                              GROUP=hv // num_k_heads, HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv,
                                              **pdl.kwargs(y))
    return o
