"""StepInput: the metadata of one forward pass, passed explicitly (no hidden global context).

Vocabulary (used everywhere in treeflash):
- committed: tokens whose KV / recurrent state is final; `cache.seq_len` of them.
- node: one token of a verify batch; node 0 is the root (the last committed token's successor
  input), node i > 0 has `parents[i] < i`. A chain is a tree whose parents are i - 1.
- depth: distance from the root; position = start + depth.
- plain step (parents is None): prefill or one decode token; the model commits it itself.
- verify step (parents given): nodes are written after the committed prefix, each sees the prefix
  and its own ancestors only; the caller then keeps one root-to-node path with `cache.commit(path)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StepInput:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long, absolute positions
    start: int  # committed length before this step = slot of the first new token
    parents: torch.Tensor | None = None  # [T] long, -1 for the root; None for a plain step
    tree_mask: torch.Tensor | None = None  # [T, T] bool, [i, j] = j is i or an ancestor of i
    depths: torch.Tensor | None = None  # [T] long
    # Static (CUDA-graph) mode: the caller keeps the host bookkeeping; attention writes K/V at
    # `slots` and reads the whole cache buffer under `key_mask`, so shapes never change.
    # (Batched rows, `StepInput.rows`: slots [T] grid columns, key_mask [B, T, L], for kv/batch_rows.py.)
    slots: torch.Tensor | None = None  # [T] long, cache slot of each new token
    key_mask: torch.Tensor | None = None  # [T, max_len] bool, which cache slots each token sees

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_verify(self) -> bool:
        return self.parents is not None

    def to(self, device: torch.device) -> "StepInput":
        """The same step with every tensor on `device` (a tree built on the host for a graph runner)."""
        if self.input_ids.device == device:
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return StepInput(move(self.input_ids), move(self.positions), self.start, move(self.parents), move(self.tree_mask),
                         move(self.depths), move(self.slots), move(self.key_mask))

    @staticmethod
    def plain(input_ids: torch.Tensor, start: int) -> "StepInput":
        n = input_ids.shape[0]
        positions = torch.arange(start, start + n, device=input_ids.device)
        return StepInput(input_ids=input_ids, positions=positions, start=start)

    @staticmethod
    def tree(input_ids: torch.Tensor, parents: list[int] | torch.Tensor, start: int) -> "StepInput":
        """A verify step over nodes with the given parents (parents[0] == -1, parents[i] < i)."""
        dev = input_ids.device
        par = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
        n = len(par)
        if n != input_ids.shape[0] or n == 0 or par[0] != -1:
            raise ValueError("tree: parents must start with -1 and match input_ids")
        # row i of the mask (node i's ancestors and itself) as bytes: its parent's row plus bit i;
        # built with byte-string slices on the host, then one tensor (a verify step is on the host's
        # critical path: per-row tensor writes cost ~6 us a node)
        depth = [0] * n
        rows = [b"\x01" + bytes(n - 1)]
        for i in range(1, n):
            p = par[i]
            if not 0 <= p < i:
                raise ValueError(f"tree: node {i} has parent {p}; parents must precede their children")
            depth[i] = depth[p] + 1
            rows.append(rows[p][:i] + b"\x01" + rows[p][i + 1 :])
        mask = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.bool).view(n, n)
        # numpy, then from_numpy: torch.tensor(list) costs ~10 us a call on the host, a numpy array ~3
        depth_np = np.array(depth, dtype=np.int64)
        return StepInput(
            input_ids=input_ids,
            positions=torch.from_numpy(depth_np + start).to(dev),
            start=start,
            parents=torch.from_numpy(np.array(par, dtype=np.int64)).to(dev),
            tree_mask=mask.to(dev),
            depths=torch.from_numpy(depth_np).to(dev),
        )

    @staticmethod
    def rows(input_ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor, key_mask: torch.Tensor) -> "StepInput":
        """A static step over a batch of B independent rows of T tokens each (kv/batch_rows.py's RowsCache):
        input_ids, positions [B, T] long (each row counts its own positions), columns [T] long (the grid
        columns every row's tokens go to), key_mask [B, T, L] bool (which columns each row's token sees).
        The layers see the B * T tokens row-major; only the rows cache's attention tells the rows apart."""
        b, t = input_ids.shape
        if positions.shape != (b, t) or columns.shape != (t,) or key_mask.dim() != 3 or key_mask.shape[:2] != (b, t):
            raise ValueError(f"rows: ids and positions [B, T], columns [T], key_mask [B, T, L]; got {tuple(input_ids.shape)}, "
                             f"{tuple(positions.shape)}, {tuple(columns.shape)}, {tuple(key_mask.shape)}")
        return StepInput(input_ids=input_ids.reshape(-1), positions=positions.reshape(-1), start=0, slots=columns,
                         key_mask=key_mask)

    @staticmethod
    def chain(input_ids: torch.Tensor, start: int) -> "StepInput":
        """A verify step over a chain: node i's parent is i - 1."""
        return StepInput.tree(input_ids, list(range(-1, input_ids.shape[0] - 1)), start)
