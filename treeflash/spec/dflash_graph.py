"""DraftGraphs: the DFlash drafter's pass as CUDA graphs, one per number of new context rows.

On the H200 the host spends ~50-80 us per launched op, and an eager DFlash pass launches ~40 ops
per draft layer plus the head, the log-softmax and the top-k: several milliseconds, more than the
target's whole graphed verify step of a small model. Here the pass is captured once per n = 1 ..
block_size new context rows (a step commits at most block_size tokens) over static buffers:

    ints     [2] long      start (committed draft-context rows), root token   <- one H2D copy
                           (the root is also the first of the block's token ids: one buffer)
    ctx_in   [B, C]        target hidden states of the new rows (raw; the final-norm slot is
                           normalized inside the graph)                       <- one device copy
    outputs  logits [B-1, vocab] fp32 (one buffer all passes write); packed [2(B-1), K] fp64: top-K
             log-probs, then their ids

so a pass is two small copies, one replay and one read-back of `packed` (what DDTree and the
greedy chain need). Other passes (the prompt, rows piled up over plain steps) run the same
static code eagerly at their own n, or the eager model when n > B. The draft cache's buffers are
reserved once at `capacity` rows and never move, as the graphs require.

`use_graphs=False` runs the identical static code without capturing: how the CPU tests check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from treeflash.kernels.spec.topk import MAX_K, topk_logprobs, topk_logprobs_reference
from treeflash.models.runner import capture_graph
from treeflash.spec.dflash_model import DFlashModel, DraftCache




@dataclass
class _Pass:
    replay: Callable[[], None]
    logits: torch.Tensor | None = None  # [B-1, vocab] fp32
    packed: torch.Tensor | None = None  # [2(B-1), K] fp64


class DraftGraphs:
    def __init__(
        self,
        model: DFlashModel,
        target,  # CausalLM: embed() and head() are the drafter's
        cache: DraftCache,
        capacity: int,  # draft-context rows + one block the buffers must hold
        top_k: int,  # candidates per depth read back for trees (>= the largest budget)
        prepare: Callable[[torch.Tensor], torch.Tensor],  # raw context rows [n, C] -> the drafter's input
        use_graphs: bool | None = None,
    ):
        c = model.config
        dev = model.device
        self.model, self.target, self.cache, self.prepare = model, target, cache, prepare
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        self.block_size = c.block_size
        self.top_k = max(1, min(top_k, target.config.vocab_size))
        cache.reserve(capacity)
        self.capacity = cache.k[0].shape[0]
        model.rotary.reserve(self.capacity, model.dtype)  # the pass gathers cos/sin rows at its slots
        self.key_pos = torch.arange(self.capacity, device=dev)
        pin = dev.type == "cuda"
        self.host_ints = torch.zeros(2, dtype=torch.long, pin_memory=pin)
        self._hi = self.host_ints.numpy()
        # ints and the block's token ids share one buffer: [start, root, MASK, ..., MASK]. ints = its first two
        # entries, block_ids = all but the first (root, then B - 1 masks): writing the root writes the block
        self._ids = torch.full((1 + c.block_size,), c.mask_token_id, dtype=torch.long, device=dev)
        self._ids[0] = 0
        self.ints = self._ids[0:2]
        self.block_ids = self._ids[1:]
        width = len(c.target_layer_ids) * c.hidden_size
        self.ctx_in = torch.zeros(c.block_size, width, dtype=model.dtype, device=dev)
        # one logits buffer for every pass (outside the graphs' pool): each pass's own is a temporary the next
        # capture reuses, so the passes hold [B-1, vocab] fp32 once, not block_size times (the 27B shape: 15 MB each)
        self.logits = torch.zeros(c.block_size - 1, target.config.vocab_size, dtype=torch.float32, device=dev)
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.passes: dict[int, _Pass] = {}
        saved = cache.length
        for n in range(1, c.block_size + 1):
            self.passes[n] = self._capture(n)
        cache.length = saved

    # -- the static pass --
    def _run(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> logits [B-1, vocab] fp32, packed: the top-K log-probs and their ids in one fp64 tensor, one
        read-back."""
        logits, top_lp, top_ids = self._scores(n)
        self.logits.copy_(logits)
        return self.logits, torch.cat((top_lp.double(), top_ids.double()))  # ids < 2^53: exact in fp64

    def _scores(self, n: int, count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> logits [B-1, vocab] (fp32: CausalLM.head's output), top-K log-probs [B-1, K] fp32 and their
        ids [B-1, K] long."""
        c = self.model.config
        start = self.ints[0:1]
        block = self.target.embed(self.block_ids)  # [B]: root, MASK ...
        if c.input_embedding_scale != 1.0:
            block = block * c.input_embedding_scale
        hidden = self.model.forward_static(self.prepare(self.ctx_in[:n]), block, self.cache, start, self.key_pos, count)
        logits = self.model.logits(hidden[1:], self.target.head).contiguous()  # [B-1, vocab] fp32
        # fixed tree budgets may pass the kernel's MAX_K: the torch path then
        topk = topk_logprobs if self.top_k <= MAX_K else topk_logprobs_reference
        top_lp, top_ids = topk(logits, self.top_k)  # the log-softmax inside its two launches
        return logits, top_lp, top_ids

    def _capture(self, n: int) -> _Pass:
        if not self.use_graphs:
            p = _Pass(lambda: None)

            def replay():
                p.logits, p.packed = self._run(n)

            p.replay = replay
            return p
        graph, (logits, packed) = capture_graph(lambda: self._run(n), self.pool)
        return _Pass(graph.replay, logits, packed)

    def device_pass(self, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass over all B rows of `ctx_in`, of which the first `count` ([1] long on the device)
        are real, at the start and root in `ints`; then ints[0] += count, on the device. -> top-K
        log-probs [B-1, K] fp32 and their ids [B-1, K] long per depth (no packing: nothing is read
        back). Not a graph of its own: spec/device_step.py captures it inside a whole speculative
        step. Needs ints[0] + count + B < capacity - 1."""
        _, top_lp, top_ids = self._scores(self.block_size, count)
        self.ints[0:1].add_(count)
        return top_lp, top_ids

    # -- one drafting pass --
    def fits(self, n: int) -> bool:
        return 1 <= n <= self.block_size and self.cache.length + n + self.block_size <= self.capacity

    def run(self, rows: list[torch.Tensor], root: int) -> _Pass:
        """rows: the new context rows (raw target hidden states, [k_i, C] each, n = sum k_i <= B)."""
        off = 0
        for r in rows:
            self.ctx_in[off : off + r.shape[0]].copy_(r)
            off += r.shape[0]
        self._hi[0], self._hi[1] = self.cache.length, root  # numpy view of host_ints: no torch op per write
        self.ints.copy_(self.host_ints, non_blocking=True)
        p = self.passes[off]
        p.replay()
        self.cache.length += off  # the block's rows stay scratch, as in the eager pass
        return p
