"""SiLU-and-multiply over a fused gate/up projection, beside its reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.norm import _interpreting


def silu_mul_ref(gate_up):
    """gate_up: [T, 2I] -> silu(gate) * up: [T, I]."""
    g, u = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(g.float()) * u.float()).to(gate_up.dtype)


@triton.jit
def _silu_mul_kernel(X, Y, I, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(X + row * 2 * I + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(X + row * 2 * I + I + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * I + cols, (g / (1.0 + tl.exp(-g)) * u).to(Y.dtype.element_ty), mask=m)


def silu_mul(gate_up):
    if not (gate_up.is_cuda or _interpreting()):
        return silu_mul_ref(gate_up)
    if gate_up.dim() != 2 or not gate_up.is_contiguous() or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: expected a contiguous [T, 2I], got {tuple(gate_up.shape)}")
    t, two_i = gate_up.shape
    i = two_i // 2
    y = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(i, block))](gate_up, y, i, BLOCK=block)
    return y
