"""SiLU-and-multiply over a fused gate/up projection, beside its reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from treeflash.kernels.launch import pdl

from treeflash.kernels.pointwise.norm import _interpreting, row_rsqrt, row_scale_ref, rows_args


def silu_mul_ref(gate_up, rows=None):
    """gate_up: [T, 2I] -> silu(gate) * up: [T, I]. rows: None or (stream [T, N], eps): gate and up
    first times 1 / rms(stream[t]) (the MLP's input norm, folded into the gate/up weights)."""
    g, u = gate_up.float().chunk(2, dim=-1)
    if rows is not None:
        r = row_scale_ref(*rows)[:, None]
        g, u = g * r, u * r
    return (torch.nn.functional.silu(g) * u).to(gate_up.dtype)


@triton.jit
def _silu_mul_kernel(X, Y, I, ROWS, rows_eps, BLOCK: tl.constexpr, N_ROWS: tl.constexpr = 0, N_BLOCK: tl.constexpr = 16,
                     PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(X + row * 2 * I + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(X + row * 2 * I + I + cols, mask=m, other=0.0).to(tl.float32)
    if N_ROWS > 0:  # the folded norm: 1 / rms of the stream's row
        r = row_rsqrt(ROWS, row, rows_eps, N_ROWS, N_BLOCK)
        g, u = g * r, u * r
    tl.store(Y + row * I + cols, (g / (1.0 + tl.exp(-g)) * u).to(Y.dtype.element_ty), mask=m)


def silu_mul(gate_up, rows=None):
    """silu_mul_ref's contract; Triton on CUDA (or under TRITON_INTERPRET)."""
    if not (gate_up.is_cuda or _interpreting()):
        return silu_mul_ref(gate_up, rows)
    if gate_up.dim() != 2 or not gate_up.is_contiguous() or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: expected a contiguous [T, 2I], got {tuple(gate_up.shape)}")
    t, two_i = gate_up.shape
    stream, rows_eps, n_rows, n_block = rows_args(rows, t, gate_up, "silu_mul")
    i = two_i // 2
    y = torch.empty((t, i), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(i, block))](gate_up, y, i, stream, rows_eps, BLOCK=block, N_ROWS=n_rows,
                                                  N_BLOCK=n_block, **pdl.kwargs(y))
    return y


def sigmoid_gate_ref(x, gate):
    """x: [T, N], gate: [T, H, D] with H * D = N (any strides) -> x * sigmoid(gate) [T, N], each
    product rounded as torch does it in x.dtype (sigmoid rounded, then the product)."""
    s = torch.sigmoid(gate.float()).to(x.dtype).reshape(x.shape)
    return (x.float() * s.float()).to(x.dtype)


@triton.jit
def _sigmoid_gate_kernel(X, G, Y, sgt, sgh, N, D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
    g = tl.load(G + row * sgt + (cols // D) * sgh + cols % D, mask=m, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * N + cols, (x * s).to(Y.dtype.element_ty), mask=m)


def sigmoid_gate(x, gate):
    """The gated attention output (qwen3_5): one kernel for x * sigmoid(gate), reading the gate
    where the q projection left it (a strided [T, H, D] view) instead of copy + sigmoid + mul."""
    if not (x.is_cuda or _interpreting()):
        return sigmoid_gate_ref(x, gate)
    t, n = x.shape
    if not x.is_contiguous() or gate.dim() != 3 or gate.shape[0] != t or gate.shape[1] * gate.shape[2] != n or gate.stride(2) != 1:
        raise ValueError(f"sigmoid_gate: x [T, N] contiguous and gate [T, H, D] (H * D = N, last dim contiguous); "
                         f"got {tuple(x.shape)} and {tuple(gate.shape)}/{gate.stride()}")
    y = torch.empty_like(x)
    block = 1024
    _sigmoid_gate_kernel[(t, triton.cdiv(n, block))](x, gate, y, gate.stride(0), gate.stride(1), n, D=gate.shape[2], BLOCK=block,
                                                         **pdl.kwargs(y))
    return y
