"""Gated DeltaNet over a verify tree, and its commit, as kernels beside their plain-torch references.

tree_conv:      node i's conv window is its K-1 nearest ancestors' inputs (beyond the root, the
                committed window), so y_i = silu(sum_k w_k * input(ancestor_{K-1-k}(i))).
tree_recurrent: node i's state continues its parent's (the root's: the committed state):
                S_i = e^{g_i} S_p;  S_i += k_i (beta_i (v_i - S_i^T k_i))^T;  o_i = S_i^T q_i.
                Only the outputs o_i are written, never a node's state (3 MiB per node and layer
                at the 27B shape). One program per (v head, v block, leaf) walks root -> leaf with
                the state in registers; nodes shared by several leaves are recomputed by each, with
                the same code, so their outputs agree to the bit.
recurrent_path: the commit. The committed state takes the decode step (`_delta_step`, the same
                per-token code as plain decoding) for each node of the kept path, in order, from
                the node's conv output and gates kept by the verify step: read and written once.
Parents precede children (parents[i] < i; -1 = the committed prefix), so a node's ancestors, in
index order, are its root-to-node path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.gdn_decode import STEP_BLOCK_V, _delta_step, recurrent_step_ref
from treeflash.kernels.norm import _interpreting

TREE_BLOCK_V = 16  # v columns per tree program: a chain runs on one leaf, so parallelism comes from heads x blocks


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
    """y: [T, conv_dim] fp32, a, b: [T, Hv], state: [Hv, Dk, Dv] (unchanged) -> o [T, Hv, Dv] fp32."""
    outs, states = [], []
    for i, p in enumerate(parents.tolist()):
        s = (state if p < 0 else states[p]).clone()
        outs.append(recurrent_step_ref(y[i], a[i], b[i], a_log, dt_bias, s, num_k_heads, k_dim, v_dim))
        states.append(s)
    return torch.stack(outs)


def recurrent_path_ref(y, a, b, a_log, dt_bias, state, path, path_len, num_k_heads: int, k_dim: int, v_dim: int) -> None:
    """state [Hv, Dk, Dv] fp32 (in place) takes one decode step per node path[0 .. path_len) (rows of y, a, b)."""
    for i in path[: int(path_len)].tolist():
        recurrent_step_ref(y[i], a[i], b[i], a_log, dt_bias, state, num_k_heads, k_dim, v_dim)


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
def _tree_recurrent_kernel(Y, A, B, ALOG, DTB, S0, PAR, MASK, O, HV, C, stride_mask, T: tl.constexpr, TP: tl.constexpr,
                           GROUP: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    leaf = tl.program_id(2)
    nodes = tl.arange(0, TP)
    children = tl.sum((tl.load(PAR + nodes, mask=nodes < T, other=-1) == leaf).to(tl.int32), axis=0)
    if children == 0:  # inner nodes' outputs come from the leaves below them
        ik = tl.arange(0, DK)
        iv = tl.program_id(1) * BV + tl.arange(0, BV)
        s = tl.load(S0 + h * DK * DV + ik[:, None] * DV + iv[None, :])
        neg_a = -tl.exp(tl.load(ALOG + h).to(tl.float32))
        dtb = tl.load(DTB + h).to(tl.float32)
        for i in range(0, T):  # ancestors precede the leaf: nothing past it is on its path
            if i <= leaf:
                if tl.load(MASK + leaf * stride_mask + i) != 0:  # i is on the root -> leaf path
                    a = tl.load(A + i * HV + h).to(tl.float32)
                    b = tl.load(B + i * HV + h).to(tl.float32)
                    s, o = _delta_step(s, Y + i * C, a, b, neg_a, dtb, h, ik, iv, GROUP, HK, DK, DV)
                    tl.store(O + (i * HV + h) * DV + iv, o)


@triton.jit
def _recurrent_path_kernel(Y, A, B, ALOG, DTB, S, PATH, LEN, HV, C, P: tl.constexpr, GROUP: tl.constexpr,
                           HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    ik = tl.arange(0, DK)
    iv = tl.program_id(1) * BV + tl.arange(0, BV)
    ptr = S + h * DK * DV + ik[:, None] * DV + iv[None, :]
    s = tl.load(ptr)
    neg_a = -tl.exp(tl.load(ALOG + h).to(tl.float32))
    dtb = tl.load(DTB + h).to(tl.float32)
    n = tl.load(LEN)
    for j in range(0, P):  # P: the path's capacity (constexpr); entries from n on are padding
        if j < n:
            i = tl.load(PATH + j)
            a = tl.load(A + i * HV + h).to(tl.float32)
            b = tl.load(B + i * HV + h).to(tl.float32)
            s, o = _delta_step(s, Y + i * C, a, b, neg_a, dtb, h, ik, iv, GROUP, HK, DK, DV)
    tl.store(ptr, s)


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


def _check_step_inputs(name, y, a, b, state, num_k_heads, k_dim, v_dim) -> None:
    hv = state.shape[0]
    if y.dtype != torch.float32 or not y.is_contiguous() or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"{name}: contiguous fp32 y and state expected")
    if state.shape != (hv, k_dim, v_dim) or y.shape[1] != 2 * num_k_heads * k_dim + hv * v_dim:
        raise ValueError(f"{name}: shapes y{tuple(y.shape)} state{tuple(state.shape)} do not match")
    if a.shape != (y.shape[0], hv) or b.shape != a.shape or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"{name}: contiguous gates a, b [{y.shape[0]}, {hv}] expected")


def tree_recurrent(y, a, b, a_log, dt_bias, state, parents, tree_mask, num_k_heads: int, k_dim: int, v_dim: int):
    """y: [T, conv_dim] fp32, a, b: [T, Hv], state: [Hv, Dk, Dv] fp32 (unchanged), parents: [T] long,
    tree_mask: [T, T] bool ([i, j] = j is i or an ancestor of i; rows may be strided) -> o [T, Hv, Dv] fp32."""
    if not (y.is_cuda or _interpreting()):
        return tree_recurrent_ref(y, a, b, a_log, dt_bias, state, parents, num_k_heads, k_dim, v_dim)
    _check_step_inputs("tree_recurrent", y, a, b, state, num_k_heads, k_dim, v_dim)
    t, c = y.shape
    if tree_mask.shape != (t, t) or tree_mask.stride(1) != 1 or parents.shape != (t,):
        raise ValueError("tree_recurrent: parents [T] and a tree mask [T, T] with unit column stride expected")
    hv = state.shape[0]
    o = torch.empty(t, hv, v_dim, dtype=torch.float32, device=y.device)
    bv = min(TREE_BLOCK_V, v_dim)
    _tree_recurrent_kernel[(hv, v_dim // bv, t)](y, a, b, a_log, dt_bias, state, parents, tree_mask, o, hv, c, tree_mask.stride(0),
                                                 T=t, TP=triton.next_power_of_2(t), GROUP=hv // num_k_heads, HK=num_k_heads,
                                                 DK=k_dim, DV=v_dim, BV=bv)
    return o


def recurrent_path(y, a, b, a_log, dt_bias, state, path, path_len, num_k_heads: int, k_dim: int, v_dim: int) -> None:
    """state [Hv, Dk, Dv] fp32 (in place) <- decode steps over nodes path[0 .. path_len) of a verify step
    (y: [T, conv_dim] fp32, a, b: [T, Hv]); path: [P] long, path_len: [1] long, both on the device
    (graph-safe: a commit graph replays with any path of at most P nodes)."""
    if not (y.is_cuda or _interpreting()):
        return recurrent_path_ref(y, a, b, a_log, dt_bias, state, path, path_len, num_k_heads, k_dim, v_dim)
    _check_step_inputs("recurrent_path", y, a, b, state, num_k_heads, k_dim, v_dim)
    if path.dim() != 1 or path_len.numel() != 1 or not path.is_contiguous():
        raise ValueError("recurrent_path: contiguous path [P] and path_len [1] expected")
    hv = state.shape[0]
    bv = min(STEP_BLOCK_V, v_dim)
    _recurrent_path_kernel[(hv, v_dim // bv)](y, a, b, a_log, dt_bias, state, path, path_len, hv, y.shape[1],
                                              P=path.shape[0], GROUP=hv // num_k_heads, HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv)
