"""Small building blocks shared by every architecture: RMSNorm, rotary embedding, SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.kernels.pointwise.activation import silu_mul
from treeflash.kernels.pointwise.norm import rmsnorm
from treeflash.kernels.linear import gemv, projection
from treeflash.models.config import ModelConfig
from treeflash.models.rope import inv_freq_and_scale
from treeflash.models.packed_linear import PackedLinear
from treeflash.models.quant_linear import QuantLinear


class RMSNorm(nn.Module):
    """y = x / rms(x) * w, computed in fp32; `unit_offset` scales by (1 + w) instead (qwen3_5)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps, self.unit_offset)[0]

    def gain(self) -> torch.Tensor:
        """[dim] fp32: what each normalized channel is multiplied by (w, or 1 + w with unit_offset)."""
        w = self.weight.detach().float()
        return w + 1.0 if self.unit_offset else w

    def fold_into(self, weight: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """weight [out, dim] with this norm's gain folded into its columns (in fp32, back in weight's
        dtype): linear(norm(x), weight) = linear(x / rms(x), fold_into(weight)). `into`: an earlier
        folded copy of the same shape, rewritten in place and returned. A CUDA graph captured over it
        keeps reading valid memory: a new tensor would free the old one under the graph (each Engine
        on a shared model calls fuse_projections; treeflash bench builds several)."""
        folded = (weight.detach().float() * self.gain()[None, :]).to(weight.dtype)
        if into is not None and into.shape == folded.shape and into.dtype == folded.dtype and into.device == folded.device:
            return into.copy_(folded)
        return folded

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                    out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """s = x + residual (x alone when residual is None); returns (norm(s), s) in one pass. `out`:
        contiguous rows that receive norm(s)."""
        return rmsnorm(x, self.weight, self.eps, self.unit_offset, residual, out=out)


TABLE_MAX_POSITIONS = 1 << 20  # a longer context computes cos/sin per step (the table would take 2 * n * rotary_dim values)


class Rotary(nn.Module):
    """Rotary position embedding over the first `rotary_dim` dims of each head (rotate-half layout).
    Scaled frequencies and YaRN's attention_factor (cos and sin multiplied by it) come from models/rope.py."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        dim = config.rotary_dim
        inv_freq, self.attention_factor = inv_freq_and_scale(config.rope_theta, dim, dict(config.rope_scaling))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("table", None, persistent=False)  # [2, n, rotary_dim]: cos, sin at 0 .. n-1 (reserve)
        self._old_tables: list[torch.Tensor] = []  # tables a larger reserve replaced
        self.rotary_dim = dim

    def reserve(self, n: int, dtype: torch.dtype) -> None:
        """Precompute cos and sin at positions 0 .. n-1 in `dtype` (grown, never shrunk; up to
        TABLE_MAX_POSITIONS). `cos_sin` with a `limit` the table covers then gathers their rows in one
        launch instead of computing them in seven: each forward of a CUDA graph pays per launch. Same
        formula, so the same values (up to the CPU's vectorized-vs-scalar last bit)."""
        t = self.table
        if n > TABLE_MAX_POSITIONS or (t is not None and t.dtype == dtype and t.shape[1] >= n):
            return
        cos, sin = self._compute(torch.arange(n, device=self.inv_freq.device), dtype)
        if t is not None:  # kept alive: CUDA graphs captured over it still read it (a runner of a shorter cache)
            self._old_tables.append(t)
        self.table = torch.stack((cos, sin))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] long -> cos, sin [T, rotary_dim]. `limit`: the caller knows every position is
        below it; a reserved table that covers it serves the rows (else they are computed)."""
        t = self.table
        if limit is not None and t is not None and t.dtype == dtype and limit <= t.shape[1] and t.device == positions.device:
            both = t.index_select(1, positions)  # [2, T, rotary_dim], one launch
            return both[0], both[1]
        return self._compute(positions, dtype)

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.attention_factor != 1.0:
            return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, head_dim]; cos, sin: [T, rotary_dim]
    rd = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    x_rot = x[..., :rd]
    half = rd // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = x_rot * cos + rotated * sin
    if rd == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rd:]), dim=-1)


def fuse_linears(lins: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several nn.Linear over the same input: the concatenation along the
    outputs. Each layer's parameters become views of it, so names, state dicts and loading are
    unchanged. -> (weight [sum N_i, K], bias [sum N_i] or None)."""
    sizes = [lin.weight.shape[0] for lin in lins]
    weight = torch.cat([lin.weight.data for lin in lins], dim=0)
    for lin, part in zip(lins, weight.split(sizes, dim=0)):
        lin.weight = nn.Parameter(part, requires_grad=False)
    bias = None
    if lins[0].bias is not None:
        bias = torch.cat([lin.bias.data for lin in lins], dim=0)
        for lin, part in zip(lins, bias.split(sizes, dim=0)):
            lin.bias = nn.Parameter(part, requires_grad=False)
    return weight, bias


def fuse_packed(layers: list[nn.Module]) -> nn.Module | None:
    """One PackedLinear over the outputs of `layers` where they can share a launch (GGUF blocks of one
    format: QuantLinear.concat), else None (each layer then runs alone)."""
    return QuantLinear.concat(layers)


def can_fuse_packed(layers: list[nn.Module]) -> bool:
    return QuantLinear.can_concat(layers)


class PackedRuns(nn.Module):
    """Projections of one input where only runs of neighbours share a format (a Q4_K_M file keeps
    attn_v at Q6_K in some layers, the DeltaNet's alpha/beta at Q8_0): each run of 2+ layers fused
    into one launch, the others alone. forward -> every original layer's output, in order."""

    def __init__(self, runs: list[nn.Module], sizes: list[list[int]]):
        super().__init__()
        self.runs = nn.ModuleList(runs)
        self.sizes = sizes  # per run: the out_features of the layers it holds

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        for run, sizes in zip(self.runs, self.sizes):
            y = run(x)
            outs.extend(y.split(sizes, dim=-1) if len(sizes) > 1 else (y,))
        return outs


def fuse_packed_runs(layers: list[nn.Module]) -> PackedRuns | None:
    """PackedRuns over `layers` (all PackedLinear), or None where no two neighbours fuse."""
    if not all(isinstance(m, PackedLinear) for m in layers):
        return None
    runs, sizes, i = [], [], 0
    while i < len(layers):
        j = len(layers)
        while j > i + 1 and not can_fuse_packed(layers[i:j]):  # the longest run from i that fuses
            j -= 1
        group = layers[i:j]
        runs.append(fuse_packed(group) if len(group) > 1 else group[0])
        sizes.append([m.out_features for m in group])
        i = j
    if all(len(s) == 1 for s in sizes):
        return None
    return PackedRuns(runs, sizes)


def packed_outputs(module: nn.Module, x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The outputs of fused projections: PackedRuns gives them apart, one PackedLinear concatenated."""
    y = module(x)
    return list(y) if isinstance(y, list) else list(y.split(sizes, dim=-1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

        self.register_buffer("gate_up", None, persistent=False)  # [2 * inner, hidden] once fused (gate_proj/up_proj become views)
        self.register_buffer("gate_up_folded", None, persistent=False)  # the same times the norm's scale: fold_norm
        self.gate_up_packed = None  # one PackedLinear for gate and up (models.int4_linear, models.quant_linear)
        self.gemv_tables = gemv.TUNED  # which one-row projections take the GEMVs (CausalLM.fuse_projections)

    def fuse(self) -> None:
        """One GEMV for gate and up: the two weights become views of one [2I, H] tensor."""
        if self.gate_up is not None or self.gate_up_packed is not None:
            return
        lins = [self.gate_proj, self.up_proj]
        if all(type(lin) is nn.Linear for lin in lins):
            self.gate_up, _ = fuse_linears(lins)  # a registered buffer: .to() carries it
        else:
            self.gate_up_packed = fuse_packed(lins)

    def fold_norm(self, norm: RMSNorm) -> None:
        """gate_up_folded = gate_up with the norm's scale folded into its columns (forward_folded); needs fuse()."""
        self.gate_up_folded = norm.fold_into(self.gate_up, self.gate_up_folded)

    def forward_folded(self, s: torch.Tensor, norm_eps: float) -> torch.Tensor:
        """s + down(swiglu(gate_up(norm(s)))) with s updated in place: gate_up_folded reads s itself, the
        SiLU-mul applies 1 / rms(s), and down adds into s in its GEMM (beta = 1). s: [T, hidden]."""
        act = projection.folded_swiglu(s, self.gate_up_folded, norm_eps, self.gemv_tables)  # [T, inner]
        return projection.folded(act, self.down_proj.weight, add_into=s, tables=self.gemv_tables)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_packed is not None:
            return self.down_proj(silu_mul(self.gate_up_packed(x)))
        if self.gate_up is not None:
            return projection.apply(self.down_proj, projection.swiglu(x, self.gate_up, self.gemv_tables), self.gemv_tables)
        t = self.gemv_tables
        act = F.silu(projection.apply(self.gate_proj, x, t)) * projection.apply(self.up_proj, x, t)  # apply: CPU row padding
        return projection.apply(self.down_proj, act, t)
