"""Gated DeltaNet: the linear-attention layer of qwen3_5 (Qwen3.5/3.6) hybrid targets.

Per token t, after a short causal conv (kernel K, SiLU) over the projected q, k, v channels:

    q_t, k_t = l2norm(q_t) / sqrt(Dk), l2norm(k_t)        (per head; k heads shared by Hv / Hk v heads)
    beta_t = sigmoid(b_t)                                  the write strength, in (0, 1)
    g_t = -exp(A_log) * softplus(a_t + dt_bias)            the log decay, <= 0
    S = exp(g_t) * S_{t-1}                                 state S: [Dk, Dv] per v head, fp32
    S_t = S + k_t (beta_t * (v_t - S^T k_t))^T             delta rule: write only what S mispredicts
    o_t = S_t^T q_t
    out_t = out_proj(rmsnorm(o_t) * w * silu(z_t))

The math lives in pure functions (tensors in, tensors out), each the plain-torch reference for
a later kernel: `causal_conv` (a sequence), `tree_causal_conv` (verify nodes), `delta_rule_chunked`
(prefill), `delta_rule_step` (decode, or one depth level of a verify tree) and `delta_rule_tree`.

A verify step leaves the committed conv window and state untouched: node i's conv window holds
its ancestors' inputs (beyond the root, the committed window) and its state continues its
parent's (the root's, the committed state). The per-node inputs and states go to
`cache.set_pending`; `RecurrentCache.commit(path)` keeps one root-to-node path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.kernels.gdn_decode import conv_step, recurrent_step
from treeflash.kernels.gdn_tree import tree_conv, tree_recurrent
from treeflash.kernels.linear import linear_fused
from treeflash.kernels.norm import rmsnorm_gated
from treeflash.kv.recurrent_cache import RecurrentCache
from treeflash.models.config import ModelConfig
from treeflash.models.step import StepInput

if TYPE_CHECKING:
    from treeflash.models.layers import RMSNorm

CHUNK_SIZE = 64


def causal_conv(
    x: torch.Tensor,  # [T, C] new inputs
    window: torch.Tensor,  # [C, K-1] the K-1 inputs before x, oldest first
    weight: torch.Tensor,  # [C, K] depthwise kernel; column K-1 multiplies the current input
) -> tuple[torch.Tensor, torch.Tensor]:  # y: [T, C] fp32 (after SiLU), new window: [C, K-1]
    kernel = weight.shape[1]
    full = torch.cat((window.to(x.dtype), x.transpose(0, 1)), dim=1).float()  # [C, K-1+T]
    y = F.conv1d(full[None], weight.float()[:, None, :], groups=full.shape[0])[0]  # [C, T]
    new_window = full[:, full.shape[1] - (kernel - 1) :].to(window.dtype)
    return F.silu(y).transpose(0, 1), new_window


def tree_conv_index(
    parents: torch.Tensor,  # [T] long, -1 for a node whose parent is the committed prefix
    depths: torch.Tensor,  # [T] long
    kernel: int,
) -> torch.Tensor:  # [T, K] long: rows of cat(window^T, x) that node i's conv reads, oldest first
    """Row r < K-1 is committed window column r (K-2 the most recent); row K-1+j is node j."""
    anc = torch.arange(parents.shape[0], device=parents.device)  # the j-th ancestor, j = 0: the node
    cols = []
    for j in range(kernel):
        from_nodes = kernel - 1 + anc
        from_window = kernel - 1 - (j - depths)  # past the root: the (j - depth)-th latest committed input
        cols.append(torch.where(j <= depths, from_nodes, from_window))
        anc = parents[anc.clamp(min=0)]
    return torch.stack(cols[::-1], dim=1)


def tree_causal_conv(
    x: torch.Tensor,  # [T, C] inputs of the verify nodes
    window: torch.Tensor,  # [C, K-1] committed window, oldest first
    weight: torch.Tensor,  # [C, K]
    parents: torch.Tensor,  # [T] long
    depths: torch.Tensor,  # [T] long
) -> torch.Tensor:  # [T, C] fp32 (after SiLU)
    rows = torch.cat((window.transpose(0, 1).to(x.dtype), x), dim=0)  # [K-1+T, C]
    idx = tree_conv_index(parents, depths, weight.shape[1])  # [T, K]
    y = torch.einsum("tkc,ck->tc", rows[idx].float(), weight.float())
    return F.silu(y)


def delta_rule_step(
    q: torch.Tensor,  # [N, H, Dk] fp32, normalized and scaled
    k: torch.Tensor,  # [N, H, Dk] fp32, normalized
    v: torch.Tensor,  # [N, H, Dv] fp32
    g: torch.Tensor,  # [N, H] fp32 log decay
    beta: torch.Tensor,  # [N, H] fp32
    state: torch.Tensor,  # [N, H, Dk, Dv] fp32, the state before each row's token
) -> tuple[torch.Tensor, torch.Tensor]:  # o: [N, H, Dv], state after: [N, H, Dk, Dv]
    """One token per row, each row from its own state."""
    s = state * g.exp()[..., None, None]
    predicted = torch.einsum("nhkv,nhk->nhv", s, k)
    update = beta[..., None] * (v - predicted)
    s = s + k[..., :, None] * update[..., None, :]
    return torch.einsum("nhkv,nhk->nhv", s, q), s


def delta_rule_chunked(
    q: torch.Tensor,  # [T, H, Dk] fp32, normalized and scaled
    k: torch.Tensor,  # [T, H, Dk] fp32, normalized
    v: torch.Tensor,  # [T, H, Dv] fp32
    g: torch.Tensor,  # [T, H] fp32 log decay
    beta: torch.Tensor,  # [T, H] fp32
    state: torch.Tensor,  # [H, Dk, Dv] fp32 initial state
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:  # o: [T, H, Dv], final state: [H, Dk, Dv]
    """The same recurrence, a chunk of tokens at a time (the WY / UT form of DeltaNet).

    Within a chunk starting from state S0, with c_i = g_1 + ... + g_i (decay from the chunk start):
        u_i = beta_i (v_i - e^{c_i} S0^T k_i - sum_{j<i} e^{c_i - c_j} (k_i . k_j) u_j)
    i.e. (I + L) U = beta V - beta e^c K S0 with L strictly lower triangular, solved once per chunk;
        o_i = e^{c_i} S0^T q_i + sum_{j<=i} e^{c_i - c_j} (q_i . k_j) u_j
        S_C = e^{c_C} S0 + sum_j e^{c_C - c_j} k_j u_j^T
    """
    num_tokens = q.shape[0]
    pad = (-num_tokens) % chunk_size

    def chunked(x: torch.Tensor) -> torch.Tensor:  # [T, H, *] -> [H, num_chunks, chunk, *]
        # padding rows have beta = 0 and g = 0: they neither write nor decay the state
        x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)).transpose(0, 1)
        return x.reshape(x.shape[0], -1, chunk_size, *x.shape[2:])

    q, k, v, g, beta = (chunked(x) for x in (q, k, v, g, beta))
    c = g.cumsum(-1)  # [H, N, C]
    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [H, N, C, C]
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2) * decay).tril(-1) + torch.eye(chunk_size, device=q.device)
    u_free = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    u_read = torch.linalg.solve_triangular(system, k_beta * c.exp()[..., None], upper=False, unitriangular=True)
    attn = q @ k.transpose(-1, -2) * decay  # [H, N, C, C]
    q_read = q * c.exp()[..., None]  # reads S0 decayed to each position
    k_write = k * (c[..., -1:] - c).exp()[..., None]  # writes decayed to the chunk end
    chunk_decay = c[..., -1].exp()[..., None, None]  # [H, N, 1, 1]

    s = state.float()
    out = torch.empty_like(v)
    for n in range(q.shape[1]):
        u = u_free[:, n] - u_read[:, n] @ s  # [H, C, Dv]
        out[:, n] = q_read[:, n] @ s + attn[:, n] @ u
        s = s * chunk_decay[:, n] + k_write[:, n].transpose(-1, -2) @ u
    out = out.reshape(out.shape[0], -1, out.shape[-1])[:, :num_tokens].transpose(0, 1)
    return out, s


def delta_rule_tree(
    q: torch.Tensor,  # [T, H, Dk] fp32, normalized and scaled
    k: torch.Tensor,  # [T, H, Dk] fp32, normalized
    v: torch.Tensor,  # [T, H, Dv] fp32
    g: torch.Tensor,  # [T, H] fp32
    beta: torch.Tensor,  # [T, H] fp32
    state: torch.Tensor,  # [H, Dk, Dv] fp32 committed state
    parents: torch.Tensor,  # [T] long, -1 = the committed prefix
    depths: torch.Tensor,  # [T] long
) -> tuple[torch.Tensor, torch.Tensor]:  # o: [T, H, Dv], node states: [T, H, Dk, Dv]
    """Every node continues its parent's state; one batched step per depth level."""
    states = state.new_empty((q.shape[0] + 1, *state.shape))  # row 0: committed state, row i + 1: node i
    states[0] = state
    out = torch.empty_like(v)
    order = torch.argsort(depths, stable=True)
    for level in order.split(torch.bincount(depths).tolist()):  # parents sit on earlier levels
        o, s = delta_rule_step(q[level], k[level], v[level], g[level], beta[level], states[parents[level] + 1])
        out[level] = o
        states[level + 1] = s
    return out, states[1:]


def delta_rule_tree_lowrank(
    q: torch.Tensor,  # [T, H, Dk] fp32, normalized and scaled
    k: torch.Tensor,  # [T, H, Dk] fp32, normalized
    v: torch.Tensor,  # [T, H, Dv] fp32
    g: torch.Tensor,  # [T, H] fp32
    beta: torch.Tensor,  # [T, H] fp32
    state: torch.Tensor,  # [H, Dk, Dv] fp32 committed state
    tree_mask: torch.Tensor,  # [T, T] bool, [i, j] = j is i or an ancestor of i
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The whole tree as one chunk of the WY form, with the causal mask replaced by the ancestor mask.

    Node i only involves its ancestors, and parents precede children, so the system stays unit
    lower triangular and each node's u_i equals the recurrence along its own path. No host sync,
    fixed shapes (CUDA-graph friendly). Instead of every node's state [T, H, Dk, Dv], it returns
    the factors (decay [H, T, T], k [H, T, Dk], u [H, T, Dv], c [H, T]) from which the state after
    any node `last` is  e^{c_last} S0 + sum_j decay[last, j] k_j u_j^T  (decay rows vanish off
    the path), computed once at commit.
    """
    anc = tree_mask.to(q.dtype)
    c = (anc @ g).transpose(0, 1)  # [H, T]: sum of log decays over each node's path
    qh, kh, vh, bh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), beta.transpose(0, 1)
    decay = (c[:, :, None] - c[:, None, :]).masked_fill(~tree_mask, float("-inf")).exp()  # [H, T, T]
    k_beta = kh * bh[..., None]
    eye = torch.eye(q.shape[0], device=q.device, dtype=q.dtype)
    system = (k_beta @ kh.transpose(-1, -2) * decay) * (1.0 - eye) + eye  # strictly-ancestor part + I
    u = solve_unit_lower(system, vh * bh[..., None] - (k_beta * c.exp()[..., None]) @ state)  # [H, T, Dv]
    out = (qh * c.exp()[..., None]) @ state + (qh @ kh.transpose(-1, -2) * decay) @ u
    return out.transpose(0, 1), (decay, kh, u, c)


def solve_unit_lower(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """X with system @ X = rhs, system = I + N unit lower triangular ([..., T, T]).

    On CUDA by the nilpotent product (I + N)^-1 = (I - N)(I + N^2)(I + N^4)... (N^T = 0): a few
    batched matmuls, no library solver inside the CUDA graph. Elsewhere the triangular solver.
    """
    if system.device.type != "cuda":
        return torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    return nilpotent_solve(system, rhs)


def nilpotent_solve(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    t = system.shape[-1]
    eye = torch.eye(t, device=system.device, dtype=system.dtype)
    n = system - eye
    x = rhs - n @ rhs  # (I - N) rhs
    p = n @ n
    span = 2
    while span < t:
        x = x + p @ x  # (I + N^span) x
        p = p @ p
        span *= 2
    return x


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class RMSNormGated(nn.Module):
    """y = rmsnorm(x) * w * silu(gate), per head (plain weight, not unit-offset)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return rmsnorm_gated(x.contiguous(), gate.contiguous(), self.weight, self.eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * xf.to(dtype)
        return (y * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """Parameter names equal transformers' Qwen3_5GatedDeltaNet, so its state_dict loads as is."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.num_k_heads, self.num_v_heads = c.linear_num_key_heads, c.linear_num_value_heads
        self.k_head_dim, self.v_head_dim = c.linear_key_head_dim, c.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.k_head_dim
        self.value_dim = self.num_v_heads * self.v_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        kernel = c.linear_conv_kernel_dim
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, kernel, groups=self.conv_dim, padding=kernel - 1, bias=False
        )  # depthwise; only its weight [conv_dim, 1, K] is used
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = RMSNormGated(self.v_head_dim, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, c.hidden_size, bias=False)
        self.in_proj_qkv = nn.Linear(c.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, self.num_v_heads, bias=False)
        self.register_buffer("in_proj", None, persistent=False)  # [conv_dim + value_dim + 2 Hv, hidden] once fused

    def fuse(self) -> None:
        """One GEMV for the four input projections (they become views of one weight)."""
        if self.in_proj is not None:
            return
        lins = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        fused = torch.cat([lin.weight.data for lin in lins], dim=0)
        for lin, part in zip(lins, fused.split([lin.weight.shape[0] for lin in lins], dim=0)):
            lin.weight = nn.Parameter(part, requires_grad=False)
        self.in_proj = fused  # a registered buffer: .to() carries it

    def forward(
        self, x: torch.Tensor, step: StepInput, cache: RecurrentCache,
        norm: RMSNorm | None = None,  # fused path: x is the residual stream, normed inside the input GEMV
        residual: torch.Tensor | None = None,  # fused path: returns residual + out_proj(...)
    ) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]
        n = x.shape[0]
        if norm is not None:
            mixed, z, b, a = norm.linear(x, self.in_proj).split([self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        elif self.in_proj is not None:
            mixed, z, b, a = F.linear(x, self.in_proj).split([self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        else:
            mixed, z, b, a = self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        # mixed: [T, conv_dim], the conv inputs, kept per node for commit
        z = z.reshape(n, self.num_v_heads, self.v_head_dim)
        o = self._mix(mixed, a, b, step, cache)  # [T, Hv, Dv] fp32
        out = self.norm(o.to(x.dtype), z).reshape(n, self.value_dim)
        if residual is not None:
            return linear_fused(out, self.out_proj.weight, residual=residual)
        return self.out_proj(out)

    def _mix(self, mixed, a, b, step: StepInput, cache: RecurrentCache) -> torch.Tensor:
        """Short conv + gated delta rule: fused kernels on CUDA, the plain-torch references elsewhere."""
        weight = self.conv1d.weight[:, 0]  # [conv_dim, K]
        dims = (self.num_k_heads, self.k_head_dim, self.v_head_dim)
        if mixed.is_cuda and step.is_verify:  # tree: two kernels, every node's state kept for commit
            y = tree_conv(mixed.contiguous(), cache.conv, weight, step.parents)
            o, states = tree_recurrent(y, a.contiguous(), b.contiguous(), self.A_log, self.dt_bias, cache.state,
                                       step.parents, *dims, out_states=cache.scratch)
            cache.set_pending(mixed, node_states=states)
            return o
        if mixed.is_cuda and mixed.shape[0] == 1:  # decode: two kernels, state updated in place
            y = conv_step(mixed[0].contiguous(), cache.conv, weight)
            return recurrent_step(y, a[0], b[0], self.A_log, self.dt_bias, cache.state, *dims)[None]
        beta = torch.sigmoid(b.float())  # [T, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # [T, Hv]
        if step.is_verify:
            q, k, v = self._heads(tree_causal_conv(mixed, cache.conv, weight, step.parents, step.depths))
            o, factors = delta_rule_tree_lowrank(q, k, v, g, beta, cache.state, step.tree_mask)
            cache.set_pending(mixed, factors=factors)
            return o
        conv_out, window = causal_conv(mixed, cache.conv, weight)
        cache.conv.copy_(window)
        q, k, v = self._heads(conv_out)
        if mixed.shape[0] == 1:
            o, state = delta_rule_step(q, k, v, g, beta, cache.state[None])
            state = state[0]
        else:
            o, state = delta_rule_chunked(q, k, v, g, beta, cache.state)
        cache.state.copy_(state)
        return o

    def _heads(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, conv_dim] fp32 -> q, k: [T, Hv, Dk] (normalized, q scaled), v: [T, Hv, Dv]."""
        n = conv_out.shape[0]
        q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(n, self.num_k_heads, self.k_head_dim)) * self.k_head_dim**-0.5
        k = l2norm(k.reshape(n, self.num_k_heads, self.k_head_dim))
        group = self.num_v_heads // self.num_k_heads  # v head h reads k head h // group
        if group > 1:
            q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        return q, k, v.reshape(n, self.num_v_heads, self.v_head_dim)
