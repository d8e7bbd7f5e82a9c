"""Gated DeltaNet: the linear-attention layer of qwen3_5 (Qwen3.5/3.6) hybrid targets.

Per token t, after a short causal conv (kernel K, SiLU) over the projected q, k, v channels:

    q_t, k_t = l2norm(q_t) / sqrt(Dk), l2norm(k_t)        (per head; k heads shared by Hv / Hk v heads)
    beta_t = sigmoid(b_t)                                  the write strength, in (0, 1)
    g_t = -exp(A_log) * softplus(a_t + dt_bias)            the log decay, <= 0
    S = exp(g_t) * S_{t-1}                                 state S: [Dk, Dv] per v head, fp32
    S_t = S + k_t (beta_t * (v_t - S^T k_t))^T             delta rule: write only what S mispredicts
    o_t = S_t^T q_t
    out_t = out_proj(rmsnorm(o_t) * w * silu(z_t))

Prefill runs `causal_conv` and `delta_rule_chunked` (the WY form) in PyTorch, or on CUDA with
flash-linear-attention installed, its chunked kernels (treeflash.kernels.gdn.gdn_chunk). Decode and verify
run the kernels of treeflash.kernels.gdn.gdn_decode / gdn_tree (their plain-torch references off CUDA;
a verify's outputs on the CPU come from `delta_rule_tree`, the WY form over the tree).

A verify step leaves the committed conv window and state untouched: node i's conv window holds
its ancestors' inputs (beyond the root, the committed window) and its state continues its
parent's (the root's, the committed state). Only the outputs leave the kernel; each node's decode
inputs go to `cache.set_pending`, and `RecurrentCache.commit(path)` replays the decode step along
the kept path.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from treeflash.kernels.gdn import gdn_chunk
from treeflash.kernels.gdn.gdn_decode import conv_step, recurrent_step
from treeflash.kernels.gdn.gdn_tree import tree_conv, tree_recurrent
from treeflash.kernels.pointwise.norm import rmsnorm_gated
from treeflash.kernels.linear import gemv, projection
from treeflash.kv.recurrent_cache import PendingNodes, RecurrentCache
from treeflash.models.config import ModelConfig
from treeflash.models.layers import fuse_packed_runs, packed_outputs
from treeflash.models.step import StepInput

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
    tree_mask: torch.Tensor,  # [T, T] bool, [i, j] = j is i or an ancestor of i
) -> torch.Tensor:  # o: [T, H, Dv]
    """Every node's output, the whole tree as one chunk of the WY form with the causal mask replaced
    by the ancestor mask (the CPU's verify: a few matmuls, where a step per node costs T passes
    over the state). Node i only involves its ancestors, and parents precede children, so the
    system stays unit lower triangular and each u_i equals the recurrence along i's own path."""
    c = (tree_mask.to(q.dtype) @ g).transpose(0, 1)  # [H, T]: sum of log decays over each node's path
    qh, kh, vh, bh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), beta.transpose(0, 1)
    decay = (c[:, :, None] - c[:, None, :]).masked_fill(~tree_mask, float("-inf")).exp()  # [H, T, T]
    k_beta = kh * bh[..., None]
    system = (k_beta @ kh.transpose(-1, -2) * decay).tril(-1) + torch.eye(q.shape[0], dtype=q.dtype)
    u = torch.linalg.solve_triangular(system, vh * bh[..., None] - (k_beta * c.exp()[..., None]) @ state,
                                      upper=False, unitriangular=True)  # [H, T, Dv]
    out = (qh * c.exp()[..., None]) @ state + (qh @ kh.transpose(-1, -2) * decay) @ u
    return out.transpose(0, 1)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class RMSNormGated(nn.Module):
    """y = rmsnorm(x) * w * silu(gate), per head (plain weight, not unit-offset)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """x rounded to dtype (default x.dtype) first; the result in dtype."""
        dtype = dtype or x.dtype
        if x.is_cuda:
            return rmsnorm_gated(x.contiguous(), gate, self.weight, self.eps, out_dtype=dtype)
        xf = x.to(dtype).float()
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
        self.use_fla = True  # prefill through flash-linear-attention where available; off once it failed here
        self.in_proj_packed = None  # the same over QuantLinear layers: PackedRuns (runs of one format fused)
        self.gemv_tables = gemv.TUNED  # which one-row projections take the GEMVs (CausalLM.fuse_projections)

    def fuse(self) -> None:
        """One GEMV for the four input projections (they become views of one weight)."""
        if self.in_proj is not None or self.in_proj_packed is not None:
            return
        lins = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        if not all(type(lin) is nn.Linear for lin in lins):
            self.in_proj_packed = fuse_packed_runs(list(lins))  # None: no two neighbours share a format
            return
        fused = torch.cat([lin.weight.data for lin in lins], dim=0)
        for lin, part in zip(lins, fused.split([lin.weight.shape[0] for lin in lins], dim=0)):
            lin.weight = nn.Parameter(part, requires_grad=False)
        self.in_proj = fused  # a registered buffer: .to() carries it

    def forward(
        self, x: torch.Tensor, step: StepInput, cache: RecurrentCache,
    ) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden]
        n = x.shape[0]
        if self.in_proj is not None:
            mixed, z, b, a = projection.linear(x, self.in_proj, tables=self.gemv_tables).split([self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads], dim=-1)
        elif self.in_proj_packed is not None:
            mixed, z, b, a = packed_outputs(self.in_proj_packed, x, [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads])
        else:
            mixed, z, b, a = self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        # mixed: [T, conv_dim], the conv inputs, kept per node for commit
        z = z.reshape(n, self.num_v_heads, self.v_head_dim)
        o = self._mix(mixed, a, b, step, cache)  # [T, Hv, Dv] fp32
        out = self.norm(o, z, x.dtype).reshape(n, self.value_dim)  # o: fp32, rounded to x.dtype inside
        return projection.apply(self.out_proj, out, self.gemv_tables)

    def _mix(self, mixed, a, b, step: StepInput, cache: RecurrentCache) -> torch.Tensor:
        """Short conv + gated delta rule: fused kernels on CUDA, their plain-torch references elsewhere."""
        weight = self.conv1d.weight[:, 0]  # [conv_dim, K]
        dims = (self.num_k_heads, self.k_head_dim, self.v_head_dim)
        if step.is_verify:  # every node's output, no node's state: commit replays the kept path
            # mixed, a, b: strided views of the input projection's rows, read in place (a copy each
            # was ~2 us a layer on the H200, 0.3 ms of a 27B verify step)
            y = tree_conv(mixed, cache.conv, weight, step.parents)  # [T, conv_dim] fp32
            cache.set_pending(PendingNodes(mixed, y, a, b, self.A_log, self.dt_bias, self.num_k_heads))
            if mixed.is_cuda:
                return tree_recurrent(y, a, b, self.A_log, self.dt_bias, cache.state, step.parents, step.tree_mask, *dims)
            return delta_rule_tree(*self._heads(y), *self._gates(a, b), cache.state, step.tree_mask)
        if mixed.shape[0] == 1:  # decode: the state updated in place
            y = conv_step(mixed[0].contiguous(), cache.conv, weight)
            return recurrent_step(y, a[0], b[0], self.A_log, self.dt_bias, cache.state, *dims)[None]
        conv_out, window = causal_conv(mixed, cache.conv, weight)
        cache.conv.copy_(window)
        o = None
        if self.use_fla and gdn_chunk.available(conv_out):  # flash-linear-attention's chunked kernels
            q, k, v = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
            n = conv_out.shape[0]
            try:
                o, state = gdn_chunk.chunk_gated_delta(
                    q.reshape(n, self.num_k_heads, self.k_head_dim), k.reshape(n, self.num_k_heads, self.k_head_dim),
                    v.reshape(n, self.num_v_heads, self.v_head_dim), *self._gates(a, b), cache.state, mixed.dtype)
            except Exception as e:  # noqa: BLE001 - a third-party kernel: fall back, say so once
                self.use_fla = False
                gdn_chunk.warn_failed(e)
        if o is None:
            o, state = delta_rule_chunked(*self._heads(conv_out), *self._gates(a, b), cache.state)
        cache.state.copy_(state)
        return o

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, Hv] gate inputs -> g (log decay), beta: [T, Hv] fp32."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return g, torch.sigmoid(b.float())

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
