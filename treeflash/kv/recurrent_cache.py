"""Recurrent state of one Gated DeltaNet layer: the short-conv window and the delta-rule state.

Plain steps update both in place. A verify step leaves both untouched and keeps, per node, only the
inputs of one decode step (`PendingNodes`: conv input, conv output, gates), never a node's state.
`commit(path)` then runs the decode step along the kept path from the committed state, so the
state equals what plain decoding of the path's tokens produces, and the conv window becomes the
path's last inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.kernels.gdn.gdn_tree import recurrent_path
from treeflash.kernels.spec.commit import conv_window_commit


@dataclass(frozen=True)
class RecurrentShape:
    conv_dim: int  # channels of the short causal conv (q, k and v projections together)
    conv_kernel: int  # kernel size K; the window keeps K - 1 past inputs
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class PendingNodes:
    """What a verify step of T nodes leaves for commit: per node, one decode step's inputs."""

    inputs: torch.Tensor  # [T, conv_dim] pre-conv inputs (the kept ones become the conv window)
    conv_out: torch.Tensor  # [T, conv_dim] fp32 post-conv q | k | v rows
    a: torch.Tensor  # [T, Hv] decay gate inputs, contiguous
    b: torch.Tensor  # [T, Hv] write-strength gate inputs, contiguous
    a_log: torch.Tensor  # [Hv] the layer's parameters the step reads
    dt_bias: torch.Tensor  # [Hv]
    num_k_heads: int


class RecurrentCache:
    def __init__(self, shape: RecurrentShape, dtype: torch.dtype, device: torch.device):
        self.shape = shape
        self.dtype = dtype
        self.device = device
        # conv window: [conv_dim, K - 1], oldest first; state: [Hv, Dk, Dv] fp32
        self.conv = torch.zeros(shape.conv_dim, shape.conv_kernel - 1, dtype=dtype, device=device)
        self.state = torch.zeros(shape.num_v_heads, shape.k_head_dim, shape.v_head_dim, dtype=torch.float32, device=device)
        self.pending: PendingNodes | None = None

    def set_pending(self, pending: PendingNodes) -> None:
        self.pending = pending

    def commit_path(self, path: torch.Tensor, path_len: torch.Tensor, conv_rows: torch.Tensor) -> None:
        """Graph-safe commit: path [P] long (node ids, root first; entries past path_len ignored),
        path_len [1] long, conv_rows [K-1] long: rows of cat(window^T, inputs) that form the new window."""
        p = self.pending
        assert p is not None, "no pending verify step"
        conv_window_commit(self.conv, p.inputs, conv_rows)  # one launch (the reference off CUDA)
        s = self.shape
        recurrent_path(p.conv_out, p.a, p.b, p.a_log, p.dt_bias, self.state, path, path_len, p.num_k_heads,
                       s.k_head_dim, s.v_head_dim)

    def commit(self, start: int, path: list[int]) -> None:
        k1 = self.shape.conv_kernel - 1
        rows = (list(range(k1)) + [k1 + i for i in path])[-k1:]
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        self.commit_path(as_long(path), as_long([len(path)]), as_long(rows))
        self.drop_pending()

    def drop_pending(self) -> None:
        self.pending = None

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()
        self.drop_pending()

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.state.numel() * 4
