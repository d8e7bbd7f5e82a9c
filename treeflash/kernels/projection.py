"""Which path a decode step's projection takes, and the norms fused around it.

A one-row projection of a shape in gemv's tables runs on kernels/gemv.py's GEMVs (on CUDA, or under
the Triton interpreter), every other one on F.linear (cuBLAS). Around them, the residual add + RMSNorm
can move into a GEMV instead of running as its own kernel:

- epilogue (`Deferred`, `project(defer=True)`; gemv.NORM_EPILOGUE, off: measured slower): the
  projection before a norm is held back and `RMSNorm.add_forward` runs it with the add and norm in
  its last program (`gemv.gemv_add_norm`);
- prologue (`PendingNorm`, `RMSNorm.add_forward(prologue=True)`; gemv.NORM_PROLOGUE, off until
  measured): the norm is held back and the projection after it (`linear`, `swiglu`) runs it first
  thing in every program (`gemv.gemv_norm_in`, `gemv.gemv_swiglu(norm_in=...)`).

A folded layer (models.transformer.forward_folded: each norm's gain folded into the projection after it)
projects the raw stream with `folded` and `folded_swiglu`: on one row of a tuned shape through the GEMVs,
the residual add in gemv's epilogue and 1 / rms in gemv_swiglu's (no norm launch at all); else through
kernels/gemm_pdl.py's `project` (cuBLAS unless opted in) and silu_mul's `rows`.

The switches and tables live in kernels/gemv.py and are read from there on every call (benchmarks
and tests set them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.kernels import gemm_pdl, gemv
from treeflash.kernels.activation import silu_mul
from treeflash.kernels.norm import _interpreting


def swiglu(x: torch.Tensor | PendingNorm, gate_up: torch.Tensor) -> torch.Tensor:
    """silu_mul(linear(x, gate_up)); one row of a TUNED_SWIGLU shape on CUDA: gemv_swiglu (a PendingNorm
    x as its prologue)."""
    if isinstance(x, PendingNorm):
        if takes_prologue(x.x, gate_up, gemv.TUNED_SWIGLU):
            y, x.stream = gemv.gemv_swiglu(x.x, gate_up, norm_in=x.args())
            return y
        x = x.materialize()
    if _takes_gemv(x, gate_up, gemv.TUNED_SWIGLU):
        return gemv.gemv_swiglu(x, gate_up)
    return silu_mul(linear(x, gate_up))


def _takes_gemv(x: torch.Tensor, weight: torch.Tensor, table: dict | None = None) -> bool:
    """One row on CUDA (or the interpreter) with a weight shape in `table`, gemv on; or up to
    gemv.ROWS_MAX rows (rows mode: a configuration without split-K, a weight of at most
    gemv.ROWS_WEIGHT_BYTES)."""
    table = gemv.TUNED if table is None else table
    if not (gemv.USE_GEMV and (x.is_cuda or _interpreting()) and x.dim() == 2 and weight.is_contiguous()):
        return False
    cfg = table.get(tuple(weight.shape))
    if cfg is None or x.shape[0] == 1:
        return cfg is not None
    return (x.shape[0] <= gemv.ROWS_MAX and cfg.split_k == 1
            and weight.numel() * weight.element_size() <= gemv.ROWS_WEIGHT_BYTES)


@dataclass
class PendingNorm:
    """A decode step's "residual add + RMSNorm" not yet computed (`RMSNorm.add_forward(...,
    prologue=True)`), so that the projection after it runs it as its prologue (`linear`, `swiglu`);
    `stream` (x + residual) is set once a projection or `materialize` has run it."""

    x: torch.Tensor  # [1, K]
    residual: torch.Tensor  # [1, K]
    weight: torch.Tensor  # the norm's [K]
    eps: float
    unit_offset: bool
    stream: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    def args(self) -> tuple:
        return self.residual, self.weight, self.eps, self.unit_offset

    def materialize(self) -> torch.Tensor:
        """The norm alone (its own kernel): returns the normed row and sets `stream`."""
        from treeflash.kernels.norm import rmsnorm

        normed, self.stream = rmsnorm(self.x, self.weight, self.eps, self.unit_offset, self.residual)
        return normed


def takes_prologue(x: torch.Tensor, weight: torch.Tensor, table: dict | None = None) -> bool:
    """Whether a one-row projection of this weight can run a norm prologue (NORM_PROLOGUE on, and
    NORM_PROLOGUE_SWIGLU for gate_up; a tuned shape without split-K)."""
    table = gemv.TUNED if table is None else table
    kind_on = gemv.NORM_PROLOGUE_SWIGLU if table is gemv.TUNED_SWIGLU else True
    return (gemv.NORM_PROLOGUE and kind_on and x.shape[0] == 1 and _takes_gemv(x, weight, table)
            and table[tuple(weight.shape)].split_k == 1)


# A CPU's BLAS (MKL 2024.2 on this machine) runs a 2- or 3-row fp32 product as one matrix-vector product per row,
# and from 4 rows as a matrix product that reads the weight once. One thread, SmolLM2-135M's shapes
# (stop 27): the head [49152, 576] 13.2 / 27.8 / 42.9 / 25.0 ms at 1 / 2 / 3 / 4 rows, q/k/v [960, 576] 59 / 119 /
# 177 / 127 us, down [576, 1536] 90 / 185 / 246 / 207 us, gate_up [3072, 576] 261 / 382 / 545 / 445 us. So on a CPU
# 3-row projections, and the head at 2 or 3 rows, run padded to 4 rows (a verify of 2-3 nodes: short chains,
# n-gram drafts). 2-row projections other than the head lose with padding and are left alone.
CPU_PAD_PROJECTION_ROWS = (3,)
CPU_PAD_HEAD_ROWS = (2, 3)


def cpu_padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      rows: tuple[int, ...] = CPU_PAD_PROJECTION_ROWS) -> torch.Tensor:
    """F.linear; an fp32 x [M, K] on a CPU with M in `rows` runs as 4 rows (zeros appended), the first M kept."""
    m = x.shape[0] if x.dim() == 2 else 0
    if m in rows and x.device.type == "cpu" and x.dtype == torch.float32:
        return F.linear(torch.cat((x, x.new_zeros(4 - m, x.shape[1]))), weight, bias)[:m]
    return F.linear(x, weight, bias)


def linear(x: torch.Tensor | PendingNorm, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except one row on CUDA with a TUNED weight shape when USE_GEMV: gemv (what a decode
    step's projections call). A PendingNorm x runs as gemv's prologue where it can, else first."""
    if isinstance(x, PendingNorm):
        if takes_prologue(x.x, weight):
            y, x.stream = gemv.gemv(x.x, weight, bias, config=gemv.TUNED_NORM_IN.get(tuple(weight.shape)), norm_in=x.args())
            return y
        x = x.materialize()
    if _takes_gemv(x, weight):
        return gemv.gemv(x, weight, bias)
    return cpu_padded_linear(x, weight, bias)


def apply(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x), through `linear` when the module is a plain nn.Linear (so a TUNED shape on one row
    on CUDA takes gemv); anything else (e.g. a CPU int4 layer) is called as it is."""
    if type(module) is nn.Linear:
        return linear(x, module.weight, module.bias)
    return module(x)


@dataclass
class Deferred:
    """A one-row projection x W^T not yet computed, so that the residual add and RMSNorm that follow
    it run as its epilogue (`RMSNorm.add_forward` calls `gemv.gemv_add_norm`); `value()` computes it alone."""

    x: torch.Tensor  # [1, K]
    weight: torch.Tensor  # [N, K]

    def value(self) -> torch.Tensor:  # [1, N]
        return gemv.gemv(self.x, self.weight)


def project(module: nn.Module, x: torch.Tensor, defer: bool = False) -> torch.Tensor | Deferred:
    """apply(module, x); with defer, a Deferred instead where that projection would take gemv (one
    row, a TUNED shape, no bias) and NORM_EPILOGUE is on. The caller must hand the result to
    `RMSNorm.add_forward` (or call `.value()`)."""
    if (defer and gemv.NORM_EPILOGUE and type(module) is nn.Linear and module.bias is None and x.shape[0] == 1
            and _takes_gemv(x, module.weight)):
        return Deferred(x, module.weight)
    return apply(module, x)


def folded(x: torch.Tensor, weight: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """A folded layer's projection x W^T (add_into += it in place, when given: the residual add). One row
    of a TUNED shape: gemv (the add in its epilogue); else gemm_pdl.project."""
    if x.shape[0] == 1 and _takes_gemv(x, weight):
        return gemv.gemv(x, weight, add_into=add_into)
    return gemm_pdl.project(x, weight, add_into)


def folded_swiglu(s: torch.Tensor, gate_up: torch.Tensor, eps: float) -> torch.Tensor:
    """A folded MLP's input half: silu(g) u with g, u = (s gate_up^T) / rms(s) (gate_up carries the norm's
    gain). One row of a TUNED_SWIGLU shape: one gemv_swiglu launch; else project + silu_mul(rows)."""
    if s.shape[0] == 1 and _takes_gemv(s, gate_up, gemv.TUNED_SWIGLU):
        return gemv.gemv_swiglu(s, gate_up, rows=(s, eps))
    return silu_mul(gemm_pdl.project(s, gate_up), rows=(s, eps))
