"""Gated DeltaNet decode (one token) as two fused kernels (or one: decode_step, below), beside their
plain-torch references:

conv_step:      window <- [window[:, 1:], x];  y = silu(sum_k w[:, k] * [window, x][:, k])   (in place)
recurrent_step: per v head h (k head h // group): q, k = l2norm, q /= sqrt(Dk);
                g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b);
                S = e^g S;  S += k (beta (v - S^T k))^T;  o = S^T q                              (in place)

`_delta_step` is that step on one state tile; the tree verify and its commit (gdn_tree.py) reuse
it, so a committed path's state is computed by the same per-token code as plain decoding.

decode_step: both in ONE launch (`_decode_step_kernel`), bitwise equal to conv_step + recurrent_step.
Program (v head h, v block) computes the conv outputs it reads itself (the 2*Dk q, k channels of k
head h // GROUP, redundantly across the GROUP * Dv/BV programs of that k head, and the BV v channels
it alone reads) with the conv kernel's per-channel fp32 operations in the same tap order, stores them
to y (fp32, as conv_step does: the q/k stores of a k head's programs write identical bits), and after
a CTA barrier runs the unchanged `_delta_step` on its state tile (loaded first, in flight during the
conv); `_delta_step` reads q, k, v back from y exactly as in recurrent_step, so its norms' reductions
see the same loads in the same layout.
The window shift, race-free without a second buffer or another launch:
  - v channels: read by one program only, which shifts them in place as it reads (as conv_step does);
  - q/k channels of k head kh: read by GROUP * Dv/BV programs. Each of them, after its window loads
    (their values stored to y, then a CTA barrier) and its recurrent step, takes a ticket (atomic
    add, acq_rel, gpu scope) on a per-k-head counter; the program that draws the last ticket is the
    last reader, so it alone shifts those channels (re-reading the old window, still untouched) and
    resets the counter to 0. No program waits for another (no spin: safe with any occupancy and in
    the interpreter), the counters are 0 between launches, and their buffer is allocated once per
    device (a static pointer: CUDA-graph safe). Two decode steps of this kernel must not run
    concurrently on one device (they share the counters); the runner launches them on one stream.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl

from treeflash.kernels.pointwise.norm import _interpreting
from treeflash.kernels.launch.scratch import scratch

STEP_BLOCK_V = 32  # v columns per program of a step (decode, and commit: same tiles, same rounding)
# GatedDeltaNet._mix decodes with decode_step (one launch) instead of the two kernels when True.
# Off until it has run on a GPU: its q/k window shift relies on an atomic ticket and a barrier that
# the interpreter (programs one after another) cannot exercise. `bench/gdn_kernels_gpu.py` checks it
# bitwise against the two kernels over 16 steps at the 27B shape and times both.
FUSED_DECODE = False
_TICKET_SLOTS = 1024  # per-k-head counters of decode_step, one buffer per device


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


@triton.jit
def _conv_channels(X, WIN, W, Y, c, m, SHIFT: tl.constexpr, K: tl.constexpr):
    """conv_step's per-channel operations on channels c (mask m), in the same order: y -> Y[c];
    SHIFT: shift the window of these channels in place as it is read (only for channels no other
    program reads)."""
    x = tl.load(X + c, mask=m, other=0.0)
    acc = x.to(tl.float32) * tl.load(W + c * K + (K - 1), mask=m, other=0.0).to(tl.float32)
    prev = x
    for j in tl.static_range(K - 1):  # newest to oldest, as _conv_step_kernel
        col = K - 2 - j
        old = tl.load(WIN + c * (K - 1) + col, mask=m, other=0.0)
        acc += old.to(tl.float32) * tl.load(W + c * K + col, mask=m, other=0.0).to(tl.float32)
        if SHIFT:
            tl.store(WIN + c * (K - 1) + col, prev.to(WIN.dtype.element_ty), mask=m)
        prev = old
    tl.store(Y + c, acc / (1.0 + tl.exp(-acc)), mask=m)


@triton.jit
def _shift_window(X, WIN, c, m, K: tl.constexpr):
    """window[c] <- [window[c, 1:], x[c]] (the stores conv_step makes, in its order)."""
    prev = tl.load(X + c, mask=m, other=0.0)
    for j in tl.static_range(K - 1):
        col = K - 2 - j
        old = tl.load(WIN + c * (K - 1) + col, mask=m, other=0.0)
        tl.store(WIN + c * (K - 1) + col, prev.to(WIN.dtype.element_ty), mask=m)
        prev = old


@triton.jit
def _decode_step_kernel(X, WIN, W, Y, A, B, ALOG, DTB, S, O, TICKETS, GROUP: tl.constexpr, HK: tl.constexpr,
                        DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, K: tl.constexpr):
    h = tl.program_id(0)
    kh = h // GROUP
    ik = tl.arange(0, DK)
    iv = tl.program_id(1) * BV + tl.arange(0, BV)
    ptr = S + h * DK * DV + ik[:, None] * DV + iv[None, :]
    s0 = tl.load(ptr)  # this program's state tile (no other program touches it): in flight during the conv
    neg_a = -tl.exp(tl.load(ALOG + h).to(tl.float32))
    a = tl.load(A + h).to(tl.float32)
    b = tl.load(B + h).to(tl.float32)
    dtb = tl.load(DTB + h).to(tl.float32)
    iqk = tl.arange(0, 2 * DK)  # q channels of k head kh, then its k channels
    cqk = tl.where(iqk < DK, kh * DK + iqk, HK * DK + kh * DK + iqk - DK)
    mqk = iqk < 2 * DK
    _conv_channels(X, WIN, W, Y, cqk, mqk, False, K)  # shared with the other programs of k head kh
    cv = 2 * HK * DK + h * DV + iv
    _conv_channels(X, WIN, W, Y, cv, cv >= 0, True, K)  # this program's own v channels
    # this program's y stores visible to all its threads; its window loads are done (the y stores
    # depend on every value they loaded)
    tl.debug_barrier()
    # the recurrent step, as _recurrent_step_kernel (q, k, v read back from y)
    s, o = _delta_step(s0, Y, a, b, neg_a, dtb, h, ik, iv, GROUP, HK, DK, DV)
    tl.store(ptr, s)
    tl.store(O + h * DV + iv, o)
    # the q/k window shift of k head kh, by its last reader (off the outputs' critical path)
    ticket = tl.atomic_add(TICKETS + kh, 1, sem="acq_rel", scope="gpu")
    last = ticket == GROUP * (DV // BV) - 1  # every other reader of kh's q/k window has read it
    _shift_window(X, WIN, cqk, mqk & last, K)
    tl.atomic_xchg(TICKETS + kh, 0, mask=last, sem="relaxed", scope="gpu")


def _ticket_buffer(device: torch.device, num_k_heads: int) -> torch.Tensor:
    if num_k_heads > _TICKET_SLOTS:
        raise ValueError(f"decode_step: {num_k_heads} k heads > {_TICKET_SLOTS} ticket slots")
    return scratch("gdn_decode.tickets", device, _TICKET_SLOTS, torch.int32)


def decode_step(x, window, weight, a, b, a_log, dt_bias, state, num_k_heads: int, k_dim: int, v_dim: int):
    """conv_step + recurrent_step in one launch (bitwise equal): x [C] new input, window [C, K-1]
    and state [Hv, Dk, Dv] fp32 updated in place -> o [Hv, Dv] fp32."""
    if not (x.is_cuda or _interpreting()):
        return recurrent_step_ref(conv_step_ref(x, window, weight), a, b, a_log, dt_bias, state, num_k_heads, k_dim,
                                  v_dim)
    c, k1 = window.shape
    hv = state.shape[0]
    if not (x.is_contiguous() and window.is_contiguous() and weight.is_contiguous()) or weight.shape != (c, k1 + 1):
        raise ValueError("decode_step: contiguous x [C], window [C, K-1], weight [C, K] expected")
    if state.dtype != torch.float32 or not state.is_contiguous() or state.shape != (hv, k_dim, v_dim):
        raise ValueError("decode_step: contiguous fp32 state [Hv, Dk, Dv] expected")
    if x.shape != (c,) or c != 2 * num_k_heads * k_dim + hv * v_dim or hv % num_k_heads:
        raise ValueError(f"decode_step: shapes x{tuple(x.shape)} state{tuple(state.shape)} do not match")
    y = torch.empty(c, dtype=torch.float32, device=x.device)
    o = torch.empty(hv, v_dim, dtype=torch.float32, device=x.device)
    bv = min(STEP_BLOCK_V, v_dim)
    _decode_step_kernel[(hv, v_dim // bv)](x, window, weight, y, a.contiguous(), b.contiguous(), a_log, dt_bias, state,
                                           o, _ticket_buffer(x.device, num_k_heads), GROUP=hv // num_k_heads,
                                           HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv, K=k1 + 1)
    return o
