"""Gated DeltaNet over a verify tree, and its commit, as kernels beside their plain-torch references.

tree_conv:      node i's conv window is its K-1 nearest ancestors' inputs (beyond the root, the
                committed window), so y_i = silu(sum_k w_k * input(ancestor_{K-1-k}(i))).
tree_recurrent: node i's state continues its parent's (the root's: the committed state):
                S_i = e^{g_i} S_p;  S_i += k_i (beta_i (v_i - S_i^T k_i))^T;  o_i = S_i^T q_i.
                Only the outputs o_i are written, never a node's state (3 MiB per node and layer
                at the 27B shape). Two launches: a parallel prep (per node and head: normalized q, k,
                e^g, beta; per node p: its root -> p path and its leaf children), then one walk per
                node p that has leaf children (x v head x v block, x KSPLIT): root -> p with the
                state in registers (next node's loads prefetched), then each leaf child's output
                from p's state, without a state update. Nodes on several walks are recomputed by
                each, with the same code, so their outputs agree to the bit; padding nodes (leaf
                children of the root) cost one state-free step each.
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

from treeflash.kernels.launch import pdl

from treeflash.kernels.gdn.gdn_decode import STEP_BLOCK_V, _delta_step, recurrent_step_ref
from treeflash.kernels.pointwise.norm import _interpreting

TREE_BLOCK_V = 32  # v columns per tree program: a chain runs on one walk, so parallelism comes from heads x blocks
TREE_WARPS = 2  # H200 sweep: 32 x 2 warps fastest (chain-32 35 us, 32-node trees 28-32 us; 16 x 4 warps with the dot: 177 us)
# Measured on the H200 and removed (docs/performance.md): the walk without the next node's prefetch
# (slower), leaf children as [CB, DK] x [DK, BV] dot products (slower but on all-padding buckets),
# and the one-launch kernel with a walk per leaf (slower on trees and padding).
# Also measured and removed: the chunked (WY) form of a tree verify (a few dots instead of a walk): on the
# H200 its fastest launch took 34.2 us on DDTree-32 against the walks' 24.4, and the 27B verify-32 18.9 ms
# against 17.4 (docs/journal.md).
# the walk's output from the decayed old state (one dependent reduction per node instead of two:
# _walk_step). On: in an interleaved A/B on the H200 (bench/results/s17/ab_trees/) the 27B verify
# graph took 16.06 ms instead of 16.12 ms (chain-32) and 15.70 instead of 15.92 ms (DDTree-32);
# gpu_check passed with it. tree_recurrent(out_split=False) runs the plain walk (benchmarks).
TREE_OUT_SPLIT = True
# its launch: H200 (bench/results/s17/gdn_kernels.json) 16 v columns x 1 warp fastest of the OUT_SPLIT
# variants, and faster than the plain walk's 32 x 2: chain-32 36.0 vs 36.8 us, DDTree-32 24.4 vs 27.2,
# chain-16 18.5 vs 19.7 (32 x 2 with OUT_SPLIT: 38.7 / 28.0 / 20.6)
TREE_OUT_SPLIT_BLOCK_V = 16
TREE_OUT_SPLIT_WARPS = 1
TREE_KIDS_SPLIT = 1  # programs sharing one node's leaf children; H200 sweep (bench/results/gdn_kernels_gpu.json): 1 fastest on chains and trees (chain-32 35 us, DDTree-32 28 us vs 46 us with 4), 2 on a 128 bucket of padding (90 vs 101 us)


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
def _tree_conv_kernel(X, WIN, W, PAR, Y, C, sx, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < C
    acc = tl.load(X + i * sx + c, mask=m, other=0.0).to(tl.float32) * tl.load(W + c * K + (K - 1), mask=m, other=0.0).to(tl.float32)
    cur = i
    beyond = 0
    for j in tl.static_range(1, K):
        if cur >= 0:
            cur = tl.load(PAR + cur).to(tl.int32)
        if cur >= 0:
            val = tl.load(X + cur * sx + c, mask=m, other=0.0).to(tl.float32)
        else:
            beyond += 1
            val = tl.load(WIN + c * (K - 1) + (K - 1 - beyond), mask=m, other=0.0).to(tl.float32)
        acc += val * tl.load(W + c * K + (K - 1 - j), mask=m, other=0.0).to(tl.float32)
    tl.store(Y + i * C + c, acc / (1.0 + tl.exp(-acc)), mask=m)


@triton.jit
def _tree_prep_kernel(Y, A, B, ALOG, DTB, PAR, MASK, QK, GB, PATH, NPATH, KIDS, NKIDS, HV, C, stride_mask, sab,
                      T: tl.constexpr, TP: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, HK: tl.constexpr,
                      DK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (j, kh), j in [0, T]: for node j < T and k head kh, the normalized q (scaled) and k, and
    for its GROUP v heads the decay e^g and beta: everything of a step that does not touch the state.
    Programs (j, 0) also lay out the tree
    for walk program j, which serves node p = j - 1 (-1: the committed prefix): PATH[j] = p's root ->
    p path (NPATH[j] nodes), KIDS[j] = p's leaf children."""
    pdl.enter(PDL)
    j = tl.program_id(0)
    kh = tl.program_id(1)
    if j < T:
        ik = tl.arange(0, DK)
        row = Y + j * C
        q = tl.load(row + kh * DK + ik)
        k = tl.load(row + HK * DK + kh * DK + ik)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        tl.store(QK + (j * 2 * HK + kh) * DK + ik, q)
        tl.store(QK + (j * 2 * HK + HK + kh) * DK + ik, k)
        hs = kh * GROUP + tl.arange(0, GP)
        hm = tl.arange(0, GP) < GROUP
        neg_a = -tl.exp(tl.load(ALOG + hs, mask=hm, other=0.0).to(tl.float32))
        x = tl.load(A + j * sab + hs, mask=hm, other=0.0).to(tl.float32) + tl.load(DTB + hs, mask=hm, other=0.0).to(tl.float32)
        g = neg_a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
        b = tl.load(B + j * sab + hs, mask=hm, other=0.0).to(tl.float32)
        tl.store(GB + (j * HV + hs) * 2, tl.exp(g), mask=hm)
        tl.store(GB + (j * HV + hs) * 2 + 1, 1.0 / (1.0 + tl.exp(-b)), mask=hm)
    if kh == 0:
        p = j - 1
        c = tl.arange(0, TP)
        valid = c < T
        par = tl.load(PAR + c, mask=valid, other=-2).to(tl.int32)
        nkids = tl.sum((par[:, None] == c[None, :]).to(tl.int32), axis=0)  # [TP]: children of each node
        leafkid = valid & (nkids == 0) & (par == p)
        tl.store(KIDS + j * TP + tl.cumsum(leafkid.to(tl.int32), axis=0) - 1, c, mask=leafkid)
        tl.store(NKIDS + j, tl.sum(leafkid.to(tl.int32), axis=0))
        onpath = valid & (p >= 0) & (tl.load(MASK + tl.maximum(p, 0) * stride_mask + c, mask=valid, other=0) != 0)
        tl.store(PATH + j * TP + tl.cumsum(onpath.to(tl.int32), axis=0) - 1, c, mask=onpath)
        tl.store(NPATH + j, tl.sum(onpath.to(tl.int32), axis=0))


@triton.jit
def _walk_load(QO, KO, VO, GB, i, h, HV, C, ik, iv, HK: tl.constexpr, DK: tl.constexpr):
    q = tl.load(QO + i * 2 * HK * DK + ik)
    k = tl.load(KO + i * 2 * HK * DK + ik)
    v = tl.load(VO + i * C + iv)
    return q, k, v, tl.load(GB + (i * HV + h) * 2), tl.load(GB + (i * HV + h) * 2 + 1)


@triton.jit
def _walk_step(s, q, k, v, dec, beta, optr, OUT_SPLIT: tl.constexpr):
    """The delta step of `_delta_step`, from prepared q, k, e^g, beta; stores the output at optr.
    OUT_SPLIT: the output from the decayed old state, o = (e^g S)^T q + (q . k) u with
    u = beta (v - (e^g S)^T k), so its reduction runs beside pred's instead of after the update (one
    dependent reduction per path node instead of two; rounding differs from the decode step's)."""
    s = s * dec
    if OUT_SPLIT:
        o, u = _out_from_decayed(s, q, k, v, beta)
        tl.store(optr, o)
        s = s + k[:, None] * u[None, :]
    else:
        pred = tl.sum(s * k[:, None], axis=0)
        s = s + k[:, None] * (beta * (v - pred))[None, :]
        tl.store(optr, tl.sum(s * q[:, None], axis=0))
    return s


@triton.jit
def _out_from_decayed(sd, q, k, v, beta):
    """A node's output from its parent's decayed state sd = e^g S (no update needed): returns
    (o, u) with u = beta (v - sd^T k) and o = sd^T q + (q . k) u."""
    pred = tl.sum(sd * k[:, None], axis=0)
    u = beta * (v - pred)
    return tl.sum(sd * q[:, None], axis=0) + tl.sum(q * k, axis=0) * u, u


@triton.jit
def _walk_prefetch_node(s, d, n, i, q, k, v, dec, beta, PATH, QO, KO, VO, GB, O, h, HV, C, ik, iv, HK: tl.constexpr,
                        DK: tl.constexpr, DV: tl.constexpr, OUT_SPLIT: tl.constexpr):
    """Step path node d (already loaded) after issuing the loads of node d + 1."""
    i_n = tl.load(PATH + d + 1, mask=d + 1 < n, other=0)
    q_n, k_n, v_n, d_n, b_n = _walk_load(QO, KO, VO, GB, i_n, h, HV, C, ik, iv, HK, DK)
    s = _walk_step(s, q, k, v, dec, beta, O + (i * HV + h) * DV + iv, OUT_SPLIT)
    return s, i_n, q_n, k_n, v_n, d_n, b_n


@triton.jit
def _walk_kid(s, i, QO, KO, VO, GB, O, h, HV, C, ik, iv, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):
    """Leaf child i of the walk's node (state s): its output only, the step without the state update,
    o = (e^g S)^T q + (q . k) beta (v - (e^g S)^T k)."""
    q, k, v, dec, beta = _walk_load(QO, KO, VO, GB, i, h, HV, C, ik, iv, HK, DK)
    o, _ = _out_from_decayed(s * dec, q, k, v, beta)
    tl.store(O + (i * HV + h) * DV + iv, o)


@triton.jit
def _tree_walk_kernel(QK, GB, Y, S0, PATH, NPATH, KIDS, NKIDS, O, HV, C, TP: tl.constexpr, GROUP: tl.constexpr,
                      HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                      KSPLIT: tl.constexpr, BOUNDED: tl.constexpr, PDL: tl.constexpr = False,
                      OUT_SPLIT: tl.constexpr = False):
    """Program (h, v block, j): if node p = j - 1 has leaf children, walk root -> p with the state tile
    in registers (one delta step per node from the prepared q, k, e^g, beta, the next node's vectors
    loading while this node's step runs; outputs written), then the leaf children's outputs from p's
    state, one at a time (a leaf's state is never needed): padding nodes (leaf children of the root)
    cost two reductions each. KSPLIT programs (r = 0 .. KSPLIT-1) share p's leaf children (each walks
    the path). BOUNDED (the interpreter, which cannot loop to a loaded bound): loops run to TP, guarded."""
    pdl.enter(PDL)
    h = tl.program_id(0)
    j = tl.program_id(2) // KSPLIT
    r = tl.program_id(2) % KSPLIT
    nk = tl.load(NKIDS + j)
    if nk > r:
        kh = h // GROUP
        ik = tl.arange(0, DK)
        iv = tl.program_id(1) * BV + tl.arange(0, BV)
        QO = QK + kh * DK
        KO = QK + (HK + kh) * DK
        VO = Y + 2 * HK * DK + h * DV
        P = PATH + j * TP
        s = tl.load(S0 + h * DK * DV + ik[:, None] * DV + iv[None, :])
        n = tl.load(NPATH + j)
        i = tl.load(P, mask=n > 0, other=0)
        q, k, v, dec, beta = _walk_load(QO, KO, VO, GB, i, h, HV, C, ik, iv, HK, DK)
        if BOUNDED:
            for d in range(0, TP):
                if d < n:
                    s, i, q, k, v, dec, beta = _walk_prefetch_node(s, d, n, i, q, k, v, dec, beta, P, QO, KO, VO, GB, O,
                                                                   h, HV, C, ik, iv, HK, DK, DV, OUT_SPLIT)
        else:
            for d in range(0, n):
                s, i, q, k, v, dec, beta = _walk_prefetch_node(s, d, n, i, q, k, v, dec, beta, P, QO, KO, VO, GB, O,
                                                               h, HV, C, ik, iv, HK, DK, DV, OUT_SPLIT)
        KD = KIDS + j * TP  # one child at a time (every KSPLIT-th, from r): o_c from p's state
        if BOUNDED:
            for e in range(0, TP):
                if (e < nk) & (e % KSPLIT == r):
                    _walk_kid(s, tl.load(KD + e), QO, KO, VO, GB, O, h, HV, C, ik, iv, HK, DK, DV)
        else:
            for e in range(r, nk, KSPLIT):
                _walk_kid(s, tl.load(KD + e), QO, KO, VO, GB, O, h, HV, C, ik, iv, HK, DK, DV)


@triton.jit
def _recurrent_path_kernel(Y, A, B, ALOG, DTB, S, PATH, LEN, HV, C, sab, P: tl.constexpr, GROUP: tl.constexpr,
                           HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
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
            a = tl.load(A + i * sab + h).to(tl.float32)
            b = tl.load(B + i * sab + h).to(tl.float32)
            s, o = _delta_step(s, Y + i * C, a, b, neg_a, dtb, h, ik, iv, GROUP, HK, DK, DV)
    tl.store(ptr, s)


def tree_conv(x, window, weight, parents):
    if not (x.is_cuda or _interpreting()):
        return tree_conv_ref(x, window, weight, parents)
    t, c = x.shape
    if not (x.stride(1) == 1 and window.is_contiguous() and weight.is_contiguous()) or weight.shape[0] != c:
        raise ValueError("tree_conv: x [T, C] (rows may be strided), contiguous window [C, K-1] and weight [C, K] expected")
    y = torch.empty(t, c, dtype=torch.float32, device=x.device)
    block = 512
    _tree_conv_kernel[(t, triton.cdiv(c, block))](x, window, weight, parents, y, c, x.stride(0), K=weight.shape[1], BLOCK=block,
                                                 **pdl.kwargs(y))
    return y


def _check_step_inputs(name, y, a, b, state, num_k_heads, k_dim, v_dim) -> int:
    """-> the gates' row stride (a and b may be views of one projection's rows)."""
    hv = state.shape[0]
    if y.dtype != torch.float32 or not y.is_contiguous() or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"{name}: contiguous fp32 y and state expected")
    if state.shape != (hv, k_dim, v_dim) or y.shape[1] != 2 * num_k_heads * k_dim + hv * v_dim:
        raise ValueError(f"{name}: shapes y{tuple(y.shape)} state{tuple(state.shape)} do not match")
    if a.shape != (y.shape[0], hv) or b.shape != a.shape or a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) != b.stride(0):
        raise ValueError(f"{name}: gates a, b [{y.shape[0]}, {hv}] with unit column stride and one row stride expected")
    return a.stride(0)


def tree_recurrent(y, a, b, a_log, dt_bias, state, parents, tree_mask, num_k_heads: int, k_dim: int, v_dim: int, *,
                   block_v: int | None = None, num_warps: int | None = None, kids_split: int | None = None,
                   out_split: bool | None = None):
    """y: [T, conv_dim] fp32, a, b: [T, Hv], state: [Hv, Dk, Dv] fp32 (unchanged), parents: [T] long,
    tree_mask: [T, T] bool ([i, j] = j is i or an ancestor of i; rows may be strided) -> o [T, Hv, Dv] fp32.
    Two launches: a parallel prep (normalized q, k, gates, each walk's path and leaf children), then the
    walks. The keyword arguments pick a variant (benchmarks); None = the module defaults."""
    if not (y.is_cuda or _interpreting()):
        return tree_recurrent_ref(y, a, b, a_log, dt_bias, state, parents, num_k_heads, k_dim, v_dim)
    sab = _check_step_inputs("tree_recurrent", y, a, b, state, num_k_heads, k_dim, v_dim)
    t, c = y.shape
    if tree_mask.shape != (t, t) or tree_mask.stride(1) != 1 or parents.shape != (t,):
        raise ValueError("tree_recurrent: parents [T] and a tree mask [T, T] with unit column stride expected")
    hv = state.shape[0]
    group = hv // num_k_heads
    tp = triton.next_power_of_2(t)
    o = torch.empty(t, hv, v_dim, dtype=torch.float32, device=y.device)
    osplit = TREE_OUT_SPLIT if out_split is None else out_split
    bv = min(block_v or (TREE_OUT_SPLIT_BLOCK_V if osplit else TREE_BLOCK_V), v_dim)
    warps = num_warps or (TREE_OUT_SPLIT_WARPS if osplit else TREE_WARPS)
    dev = y.device
    qk = torch.empty(t, 2, num_k_heads, k_dim, dtype=torch.float32, device=dev)
    gb = torch.empty(t, hv, 2, dtype=torch.float32, device=dev)
    ints = torch.empty(2 * (t + 1) * tp + 2 * (t + 1), dtype=torch.int32, device=dev)
    path, kids = ints[: (t + 1) * tp], ints[(t + 1) * tp : 2 * (t + 1) * tp]
    npath, nkids = ints[2 * (t + 1) * tp : 2 * (t + 1) * tp + t + 1], ints[2 * (t + 1) * tp + t + 1 :]
    _tree_prep_kernel[(t + 1, num_k_heads)](
        y, a, b, a_log, dt_bias, parents, tree_mask, qk, gb, path, npath, kids, nkids, hv, c, tree_mask.stride(0), sab, T=t, TP=tp,
        GROUP=group, GP=triton.next_power_of_2(group), HK=num_k_heads, DK=k_dim, **pdl.kwargs(y))
    ksplit = kids_split or TREE_KIDS_SPLIT
    _tree_walk_kernel[(hv, v_dim // bv, (t + 1) * ksplit)](qk, gb, y, state, path, npath, kids, nkids, o, hv, c, TP=tp, GROUP=group,
                                                HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv, KSPLIT=ksplit,
                                                BOUNDED=_interpreting(), num_warps=warps,
                                                OUT_SPLIT=osplit, **pdl.kwargs(y))
    return o


def recurrent_path(y, a, b, a_log, dt_bias, state, path, path_len, num_k_heads: int, k_dim: int, v_dim: int) -> None:
    """state [Hv, Dk, Dv] fp32 (in place) <- decode steps over nodes path[0 .. path_len) of a verify step
    (y: [T, conv_dim] fp32, a, b: [T, Hv]); path: [P] long, path_len: [1] long, both on the device
    (graph-safe: a commit graph replays with any path of at most P nodes)."""
    if not (y.is_cuda or _interpreting()):
        return recurrent_path_ref(y, a, b, a_log, dt_bias, state, path, path_len, num_k_heads, k_dim, v_dim)
    sab = _check_step_inputs("recurrent_path", y, a, b, state, num_k_heads, k_dim, v_dim)
    if path.dim() != 1 or path_len.numel() != 1 or not path.is_contiguous():
        raise ValueError("recurrent_path: contiguous path [P] and path_len [1] expected")
    hv = state.shape[0]
    bv = min(STEP_BLOCK_V, v_dim)
    _recurrent_path_kernel[(hv, v_dim // bv)](y, a, b, a_log, dt_bias, state, path, path_len, hv, y.shape[1], sab,
                                              P=path.shape[0], GROUP=hv // num_k_heads, HK=num_k_heads, DK=k_dim, DV=v_dim, BV=bv,
                                              **pdl.kwargs(y))
