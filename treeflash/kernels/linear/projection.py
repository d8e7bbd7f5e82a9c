"""Which path a decode step's projection takes.

A one-row projection of a shape in the model's GemvTables (`tables`, gemv.TUNED unless the model was given
others) runs on kernels/linear/gemv.py's GEMVs (on CUDA, or under the Triton interpreter), every other one
on F.linear (cuBLAS).

A folded layer (models.transformer.forward_folded: each norm's gain folded into the projection after it)
projects the raw stream with `folded` and `folded_swiglu`: on one row of a tuned shape through the GEMVs,
the residual add in gemv's epilogue and 1 / rms in gemv_swiglu's (no norm launch at all); else through
cuBLAS (addmm_ for the residual add) and silu_mul's `rows`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from treeflash.kernels.linear import gemv
from treeflash.kernels.pointwise.activation import silu_mul
from treeflash.kernels.pointwise.norm import _interpreting


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, tables: gemv.GemvTables = gemv.TUNED) -> torch.Tensor:
    """silu_mul(linear(x, gate_up)); one row of a tables.swiglu shape on CUDA: gemv_swiglu."""
    if _takes_gemv(x, gate_up, tables.swiglu):
        return gemv.gemv_swiglu(x, gate_up, config=tables.swiglu[tuple(gate_up.shape)])
    return silu_mul(linear(x, gate_up, tables=tables))


def _takes_gemv(x: torch.Tensor, weight: torch.Tensor, table: gemv.Shapes) -> bool:
    """One row on CUDA (or the interpreter) with a weight shape in `table`."""
    return ((x.is_cuda or _interpreting()) and x.dim() == 2 and x.shape[0] == 1 and weight.is_contiguous()
            and tuple(weight.shape) in table)


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           tables: gemv.GemvTables = gemv.TUNED) -> torch.Tensor:
    """F.linear, except one row on CUDA with a weight shape in tables.linear: gemv (what a decode step's
    projections call)."""
    if _takes_gemv(x, weight, tables.linear):
        return gemv.gemv(x, weight, bias, config=tables.linear[tuple(weight.shape)])
    return cpu_padded_linear(x, weight, bias)


def apply(module: nn.Module, x: torch.Tensor, tables: gemv.GemvTables = gemv.TUNED) -> torch.Tensor:
    """module(x), through `linear` when the module is a plain nn.Linear (so a tables.linear shape on one row
    on CUDA takes gemv); anything else (e.g. a CPU int4 layer) is called as it is."""
    if type(module) is nn.Linear:
        return linear(x, module.weight, module.bias, tables)
    return module(x)


def _project(x: torch.Tensor, w: torch.Tensor, add_into: torch.Tensor | None = None) -> torch.Tensor:
    """cuBLAS: x [M, K] @ w [N, K]^T, or add_into [M, N] += it in place (one rounding after the add)."""
    return F.linear(x, w) if add_into is None else add_into.addmm_(x, w.t())


def folded(x: torch.Tensor, weight: torch.Tensor, add_into: torch.Tensor | None = None,
           tables: gemv.GemvTables = gemv.TUNED) -> torch.Tensor:
    """A folded layer's projection x W^T (add_into += it in place, when given: the residual add). One row
    of a tables.linear shape: gemv (the add in its epilogue); else cuBLAS."""
    if _takes_gemv(x, weight, tables.linear):
        return gemv.gemv(x, weight, config=tables.linear[tuple(weight.shape)], add_into=add_into)
    return _project(x, weight, add_into)


def folded_swiglu(s: torch.Tensor, gate_up: torch.Tensor, eps: float, tables: gemv.GemvTables = gemv.TUNED) -> torch.Tensor:
    """A folded MLP's input half: silu(g) u with g, u = (s gate_up^T) / rms(s) (gate_up carries the norm's
    gain). One row of a tables.swiglu shape: one gemv_swiglu launch; else cuBLAS + silu_mul(rows)."""
    if _takes_gemv(s, gate_up, tables.swiglu):
        return gemv.gemv_swiglu(s, gate_up, config=tables.swiglu[tuple(gate_up.shape)], rows=(s, eps))
    return silu_mul(_project(s, gate_up), rows=(s, eps))
