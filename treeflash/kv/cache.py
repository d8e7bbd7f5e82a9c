"""ModelCache: per-layer attention KV caches and recurrent (Gated DeltaNet) states for one sequence.

A plain step appends and commits. A verify step writes nodes after the committed prefix
(node i at slot start + i) and keeps per-node recurrent states; `commit(path)` then keeps the
accepted root-to-node path: attention KV of the path is compacted into contiguous slots, the
recurrent state becomes the last path node's state, and the conv window the path's last inputs.

This layer knows nothing of model configs: the model describes its layers with a CacheLayout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from treeflash.kernels.spec.commit import RowTable
from treeflash.kv.attention_cache import DENSE_TYPES, AttentionCache, DenseAttentionCache
from treeflash.kv.quantized import QuantizedAttentionCache
from treeflash.kv.recurrent_cache import RecurrentCache, RecurrentShape
from treeflash.kv.spec import CacheSpec

__all__ = ["ATTENTION", "RECURRENT", "CacheLayout", "CacheSpec", "ModelCache", "make_attention_cache"]

ATTENTION = "attention"
RECURRENT = "recurrent"


@dataclass(frozen=True)
class CacheLayout:
    layer_kinds: tuple[str, ...]  # per layer: ATTENTION | RECURRENT
    num_kv_heads: int
    head_dim: int
    recurrent: RecurrentShape | None = None


def make_attention_cache(num_kv_heads: int, head_dim: int, spec: CacheSpec) -> AttentionCache:
    """One attention layer's cache: dense buffers for the dense types, else compressed blocks."""
    if spec.cache_type_k in DENSE_TYPES and spec.cache_type_v in DENSE_TYPES:
        return DenseAttentionCache(num_kv_heads, head_dim, spec)
    return QuantizedAttentionCache(num_kv_heads, head_dim, spec)


class ModelCache:
    def __init__(self, layout: CacheLayout, spec: CacheSpec):
        self.layout = layout
        self.spec = spec
        self.seq_len = 0  # committed tokens
        self.pending = 0  # nodes of the last verify step, not yet committed
        self.layers: list[AttentionCache | RecurrentCache] = []
        exact_k = replace(spec, cache_type_k="auto")
        attention_seen = 0
        for kind in layout.layer_kinds:
            if kind == ATTENTION:
                layer_spec = exact_k if attention_seen < spec.k_exact_layers else spec
                self.layers.append(make_attention_cache(layout.num_kv_heads, layout.head_dim, layer_spec))
                attention_seen += 1
            elif kind == RECURRENT:
                assert layout.recurrent is not None
                self.layers.append(RecurrentCache(layout.recurrent, spec.dtype, spec.device))
            else:
                raise ValueError(f"unknown layer kind {kind!r}")

    def dense_row_table(self) -> tuple[RowTable | None, set[int]]:
        """(one RowTable over the K and V buffers of every dense attention layer whose rows have the first
        one's size in bytes, the indices of those layers): what a graphed commit moves in one launch
        (kernels/commit.commit_rows_table) instead of one per layer. (None, {}) without such layers."""
        dense = [i for i, layer in enumerate(self.layers) if isinstance(layer, DenseAttentionCache) and layer.rows is not None]
        if not dense:
            return None, set()
        size = self.layers[dense[0]].rows.row_bytes
        dense = [i for i in dense if self.layers[i].rows.row_bytes == size]
        return RowTable([b for i in dense for b in (self.layers[i].k, self.layers[i].v)]), set(dense)

    @property
    def max_len(self) -> int:
        return self.spec.max_len

    def begin(self, num_new: int, verify: bool) -> None:
        """Called by the model before writing `num_new` tokens."""
        if self.pending:
            raise RuntimeError("a verify step is pending: call commit(path) first")
        if self.seq_len + num_new > self.max_len:
            raise RuntimeError(f"cache overflow: {self.seq_len} + {num_new} > max_len {self.max_len}")
        if verify:
            self.pending = num_new

    def end_plain(self, num_new: int) -> None:
        self.seq_len += num_new

    def advance(self, num_committed: int) -> None:
        """A device step wrote and committed `num_committed` tokens (its graph kept the path): count them."""
        if self.pending or self.seq_len + num_committed > self.max_len:
            raise RuntimeError(f"advance: {num_committed} tokens at {self.seq_len} of {self.max_len} (pending {self.pending})")
        self.seq_len += num_committed

    def commit(self, path: list[int]) -> None:
        """Keep the verify nodes `path` (root first, each the parent of the next) as committed tokens."""
        if not self.pending:
            raise RuntimeError("commit without a pending verify step")
        if not path or path[0] != 0 or max(path) >= self.pending:
            raise ValueError(f"commit: bad path {path} for {self.pending} pending nodes")
        for layer in self.layers:
            layer.commit(self.seq_len, path)
        self.seq_len += len(path)
        self.pending = 0

    def rollback_pending(self) -> None:
        """Drop a pending verify step entirely (nothing committed, the root included)."""
        for layer in self.layers:
            if isinstance(layer, RecurrentCache):
                layer.drop_pending()
        self.pending = 0

    def truncate(self, length: int) -> None:
        """Forget committed tokens past `length` (attention layers only; recurrent state cannot rewind)."""
        if any(isinstance(layer, RecurrentCache) for layer in self.layers) and length != self.seq_len:
            raise RuntimeError("cannot truncate a cache with recurrent layers")
        self.seq_len = min(self.seq_len, length)
        self.pending = 0

    def reset(self) -> None:
        self.seq_len = 0
        self.pending = 0
        for layer in self.layers:
            layer.reset()

    @property
    def has_recurrent(self) -> bool:
        return any(isinstance(layer, RecurrentCache) for layer in self.layers)

    def recurrent_snapshot(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every recurrent layer's (conv window, state) after the committed tokens: with
        the attention rows below seq_len, all a later sequence needs to continue from here."""
        if self.pending:
            raise RuntimeError("a verify step is pending: the recurrent state is not a committed one")
        return [(layer.conv.clone(), layer.state.clone()) for layer in self.layers if isinstance(layer, RecurrentCache)]

    def resume(self, length: int, recurrent: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """Continue after the first `length` committed tokens, whose attention rows are still in
        place: recurrent layers take the state a `recurrent_snapshot()` taken at `length` saved."""
        if length > self.seq_len:
            raise RuntimeError(f"resume({length}) past the {self.seq_len} committed tokens")
        layers = [layer for layer in self.layers if isinstance(layer, RecurrentCache)]
        if layers and (recurrent is None or len(recurrent) != len(layers)):
            raise RuntimeError("resume: recurrent layers need the snapshot taken at that length")
        for layer, (conv, state) in zip(layers, recurrent or ()):
            layer.conv.copy_(conv)
            layer.state.copy_(state)
            layer.drop_pending()
        self.seq_len = length
        self.pending = 0

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
