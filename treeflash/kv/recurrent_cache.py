"""Recurrent state of one Gated DeltaNet layer: the short-conv window and the delta-rule state.

Plain steps update both in place. A verify step stores, per node, the conv input and the state
after that node (each node's state is computed from its parent's); `commit(path)` keeps the
last path node's state and the conv window made of the path's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecurrentShape:
    conv_dim: int  # channels of the short causal conv (q, k and v projections together)
    conv_kernel: int  # kernel size K; the window keeps K - 1 past inputs
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int


class RecurrentCache:
    def __init__(self, shape: RecurrentShape, dtype: torch.dtype, device: torch.device):
        self.shape = shape
        self.dtype = dtype
        self.device = device
        # conv window: [conv_dim, K - 1], oldest first; state: [Hv, Dk, Dv] fp32
        self.conv = torch.zeros(shape.conv_dim, shape.conv_kernel - 1, dtype=dtype, device=device)
        self.state = torch.zeros(shape.num_v_heads, shape.k_head_dim, shape.v_head_dim, dtype=torch.float32, device=device)
        self.node_inputs: torch.Tensor | None = None  # [T, conv_dim] pre-conv inputs of verify nodes
        self.node_states: torch.Tensor | None = None  # [T, Hv, Dk, Dv] state after each verify node

        # or, instead of node_states, low-rank factors (decay [H,T,T], k [H,T,Dk], u [H,T,Dv], c [H,T]):
        # state after node i = e^{c_i} S0 + sum_j decay[i, j] k_j u_j^T (see delta_rule_tree_lowrank)
        self.factors: tuple[torch.Tensor, ...] | None = None
        self.scratch: torch.Tensor | None = None  # [max_nodes, Hv, Dk, Dv] fp32 node states, shared by CUDA graphs

    def set_pending(
        self,
        node_inputs: torch.Tensor,
        node_states: torch.Tensor | None = None,
        factors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        assert (node_states is None) != (factors is None), "give node states or their factors"
        self.node_inputs = node_inputs
        self.node_states = node_states
        self.factors = factors

    def state_after(self, last: int | torch.Tensor) -> torch.Tensor:
        """[Hv, Dk, Dv]: the recurrent state after pending node `last` (an int or a 0-d device tensor)."""
        if self.node_states is not None:  # index_select keeps a device index on the device (graph-safe)
            return self.node_states.index_select(0, torch.as_tensor(last, device=self.node_states.device).reshape(1))[0]
        decay, k, u, c = self.factors
        w = decay.index_select(1, torch.as_tensor(last, device=decay.device).reshape(1))  # [H, 1, T]
        c_last = c.index_select(1, torch.as_tensor(last, device=c.device).reshape(1))  # [H, 1]
        return c_last.exp()[..., None] * self.state + (k * w.transpose(1, 2)).transpose(1, 2) @ u

    def commit(self, start: int, path: list[int]) -> None:
        assert self.node_inputs is not None, "no pending verify step"
        idx = torch.tensor(path, device=self.device)
        window = torch.cat((self.conv.transpose(0, 1), self.node_inputs.index_select(0, idx).to(self.dtype)), dim=0)
        self.conv.copy_(window[-(self.shape.conv_kernel - 1) :].transpose(0, 1))
        self.state.copy_(self.state_after(path[-1]))
        self.drop_pending()

    def drop_pending(self) -> None:
        self.node_inputs = None
        self.node_states = None
        self.factors = None

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()
        self.drop_pending()

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.state.numel() * 4
