"""Gated DeltaNet over a verify tree as two kernels, beside their plain-torch references.

tree_conv:      node i's conv window is its K-1 nearest ancestors' inputs (beyond the root, the
                committed window), so y_i = silu(sum_k w_k * input(ancestor_{K-1-k}(i))).
tree_recurrent: node i's state continues its parent's (the root's: the committed state):
                S_i = e^{g_i} S_p;  S_i += k_i (beta_i (v_i - S_i^T k_i))^T;  o_i = S_i^T q_i.
                Every node's state is written out (the kept one is copied at commit). A program
                walks the nodes in order and keeps the state in registers while each node's
                parent is the previous node (chains, and a tree's main branch), reloading it
                from memory only at a branch.
Parents precede children (parents[i] < i; -1 = the committed prefix).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.gdn_decode import recurrent_step_ref
from treeflash.kernels.norm import _interpreting


def tree_conv_ref(x, window, weight, parents):
    """x: [T, C] node inputs, window: [C, K-1] committed, weight: [C, K], parents: [T] -> y [T, C] fp32."""
    t, c = x.shape
    k = weight.shape[1]
    par = parents.tolist()
    rows = []
    for i in range(t):
        taps = [x[i].float()]
        cur, beyond = i, 0
        for _ in range(k - 1):
            cur = par[cur] if cur >= 0 else -1
            if cur >= 0:
                taps.append(x[cur].float())
            else:
                beyond += 1
                taps.append(window[:, k - 1 - beyond].float())
        stacked = torch.stack(taps[::-1], dim=1)  # [C, K], oldest first
        rows.append(torch.nn.functional.silu((stacked * weight.float()).sum(-1)))
    return torch.stack(rows)


def tree_recurrent_ref(y, a, b, a_log, dt_bias, state, parents, num_k_heads: int, k_dim: int, v_dim: int):
    """y: [T, conv_dim] fp32, a, b: [T, Hv], state: [Hv, Dk, Dv] (unchanged) -> (o [T, Hv, Dv], states [T, Hv, Dk, Dv])."""
    outs, states = [], []
    for i, p in enumerate(parents.tolist()):
        s = (state if p < 0 else states[p]).clone()
        outs.append(recurrent_step_ref(y[i], a[i], b[i], a_log, dt_bias, s, num_k_heads, k_dim, v_dim))
        states.append(s)
    return torch.stack(outs), torch.stack(states)


@triton.jit
def _tree_conv_kernel(X, WIN, W, PAR, Y, C, K: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < C
    acc = tl.load(X + i * C + c, mask=m, other=0.0).to(tl.float32) * tl.load(W + c * K + (K - 1), mask=m, other=0.0).to(tl.float32)
    cur = i
    beyond = 0
    for j in tl.static_range(1, K):
        if cur >= 0:
            cur = tl.load(PAR + cur).to(tl.int32)
        if cur >= 0:
            val = tl.load(X + cur * C + c, mask=m, other=0.0).to(tl.float32)
        else:
            beyond += 1
            val = tl.load(WIN + c * (K - 1) + (K - 1 - beyond), mask=m, other=0.0).to(tl.float32)
        acc += val * tl.load(W + c * K + (K - 1 - j), mask=m, other=0.0).to(tl.float32)
    tl.store(Y + i * C + c, acc / (1.0 + tl.exp(-acc)), mask=m)


@triton.jit
def _tree_recurrent_kernel(Y, A, B, ALOG, DTB, S0, PAR, NS, O, HV, C, T: tl.constexpr, GROUP: tl.constexpr, HK: tl.constexpr,
                           DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    kh = h // GROUP
    ik = tl.arange(0, DK)
    iv = vb * BV + tl.arange(0, BV)
    blk = ik[:, None] * DV + iv[None, :]
    s = tl.load(S0 + h * DK * DV + blk)
    a_log = -tl.exp(tl.load(ALOG + h).to(tl.float32))
    dtb = tl.load(DTB + h).to(tl.float32)
    for i in range(0, T):
        p = tl.load(PAR + i)
        if p != i - 1:  # a branch: continue from the parent's stored state (or the committed one)
            tl.debug_barrier()
            if p < 0:
                s = tl.load(S0 + h * DK * DV + blk)
            else:
                s = tl.load(NS + (p * HV + h) * DK * DV + blk)
        row = Y + i * C
        q = tl.load(row + kh * DK + ik)
        k = tl.load(row + HK * DK + kh * DK + ik)
        v = tl.load(row + 2 * HK * DK + h * DV + iv)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        x = tl.load(A + i * HV + h).to(tl.float32) + dtb
        g = a_log * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
        beta = 1.0 / (1.0 + tl.exp(-tl.load(B + i * HV + h).to(tl.float32)))
        s = s * tl.exp(g)
        pred = tl.sum(s * k[:, None], axis=0)
        s = s + k[:, None] * (beta * (v - pred))[None, :]
        tl.store(NS + (i * HV + h) * DK * DV + blk, s)
        tl.store(O + (i * HV + h) * DV + iv, tl.sum(s * q[:, None], axis=0))


def tree_conv(x, window, weight, parents):
    if not (x.is_cuda or _interpreting()):
        return tree_conv_ref(x, window, weight, parents)
    t, c = x.shape
    if not (x.is_contiguous() and window.is_contiguous() and weight.is_contiguous()) or weight.shape[0] != c:
        raise ValueError("tree_conv: contiguous x [T, C], window [C, K-1], weight [C, K] expected")
    y = torch.empty(t, c, dtype=torch.float32, device=x.device)
    block = 512
    _tree_conv_kernel[(t, triton.cdiv(c, block))](x, window, weight, parents, y, c, K=weight.shape[1], BLOCK=block)
    return y


def tree_recurrent(y, a, b, a_log, dt_bias, state, parents, num_k_heads: int, k_dim: int, v_dim: int, out_states=None):
    """out_states: optional preallocated [>= T, Hv, Dk, Dv] fp32 buffer (so CUDA graphs share one)."""
    if not (y.is_cuda or _interpreting()):
        return tree_recurrent_ref(y, a, b, a_log, dt_bias, state, parents, num_k_heads, k_dim, v_dim)
    t, c = y.shape
    hv = state.shape[0]
    if y.dtype != torch.float32 or not y.is_contiguous() or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("tree_recurrent: contiguous fp32 y and state expected")
    states = out_states[:t] if out_states is not None else torch.empty(t, hv, k_dim, v_dim, dtype=torch.float32, device=y.device)
    o = torch.empty(t, hv, v_dim, dtype=torch.float32, device=y.device)
    bv = min(16, v_dim)
    _tree_recurrent_kernel[(hv, v_dim // bv)](y, a.contiguous(), b.contiguous(), a_log, dt_bias, state, parents, states, o,
                                              hv, c, T=t, GROUP=hv // num_k_heads, HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv)
    return o, states
