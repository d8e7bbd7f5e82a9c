"""DeviceChain: greedy DFlash chain steps that never wait for the host.

A synchronous speculative step reads back twice (the drafts, then the target's tokens), and on the
H200's slow host every read-back leaves the GPU idle while the host launches the next graph: the
default SmolLM2 pair measured 0.54 ms per plain token against ~1.9 ms per drafted pass. For a
greedy chain every decision of a step can be made on the device, so one CUDA graph holds it all:

    draft    the DraftGraphs pass over the rows the last step committed (their count is known
             on the device only: the pass is padded to the block, see DFlashModel.forward_static)
    verify   the target over [root, d1 .. d(t-1)], a chain (the runner's static verify at t nodes)
    accept   a = the number of leading drafts equal to the target's argmax; bonus = argmax[a]
    commit   attention KV is already in place (a chain keeps a prefix); recurrent layers replay
             their commit along nodes 0 .. a
    next     root = bonus, start += a + 1, the drafter's new rows = the verify's captured rows 0 .. a

The state (start, root, row count) lives in device memory; the host enqueues step k + 1 before it
reads step k's tokens from a ring of two pinned buffers, and only keeps the books. The drafts and
the verify are those of the synchronous chain, so the tokens are too (tests/spec/test_device_chain.py,
on the CPU with the graphs run eagerly).

    state   [3] long   start (committed target length), root token, count (new draft rows in ctx_in)
    result  [1 + t]    accepted a, then the emitted tokens: drafts 1 .. a, the bonus, padding
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from treeflash.kv.recurrent_cache import RecurrentCache
from treeflash.models.runner import CudaGraphRunner, capture_graph

ENV = "TREEFLASH_DEVICE_CHAIN"  # "0": synchronous chain steps (the A/B baseline)


@dataclass
class PendingStep:
    host: torch.Tensor  # [1 + t] long, pinned on a GPU
    event: torch.cuda.Event | None

    def read(self) -> tuple[int, list[int]]:
        """-> (accepted drafts a, the a + 1 emitted tokens)."""
        if self.event is not None:
            self.event.synchronize()
        vals = self.host.tolist()
        a = vals[0]
        return a, vals[1 : a + 2]


def supported(runner, drafter, params, want_logprobs) -> int:
    """The chain's node count when this decoder can run device steps, else 0."""
    from treeflash.spec.dflash import DFlashDrafter

    if os.environ.get(ENV, "1") == "0" or want_logprobs is not None or not params.greedy:
        return 0
    if not isinstance(runner, CudaGraphRunner) or not isinstance(drafter, DFlashDrafter):
        return 0
    if drafter.tree or drafter.tuner is not None or drafter.graphs is None or not drafter.fixed_budget:
        return 0
    if tuple(runner.capture_layers) != tuple(drafter.capture_layers):
        return 0
    t = drafter.fixed_budget + 1
    return t if 2 <= t <= min(drafter.graphs.block_size, runner.buckets[-1]) else 0


class DeviceChain:
    def __init__(self, runner: CudaGraphRunner, drafter, nodes: int):
        """Captures the step (CUDA graph on a GPU). Its warm-up runs write scratch rows and advance
        recurrent state: build it before a prefill, which resets the caches."""
        self.runner, self.drafter, self.t = runner, drafter, nodes
        g = drafter.graphs
        dev = runner.ints.device
        t = nodes
        self.state = torch.zeros(3, dtype=torch.long, device=dev)
        self.result = torch.zeros(1 + t, dtype=torch.long, device=dev)
        self.depths = torch.arange(t, device=dev)
        self.parents = torch.arange(t, device=dev) - 1
        self.tril = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        self.recurrent = [layer for layer in runner.cache.layers if isinstance(layer, RecurrentCache)]
        pin = dev.type == "cuda"
        self.host_state = torch.zeros(4, dtype=torch.long, pin_memory=pin)
        self.ring = [torch.zeros(1 + t, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._slot = 0
        self.draft_len = 0  # the draft cache length the host knows (state advances ahead of it)
        saved = [layer.pending for layer in self.recurrent]
        self.state.copy_(torch.tensor([0, 0, 1]))  # warm-ups and capture write from slot 0: scratch until the reset
        g.ints[0] = 0
        if runner.use_graphs:
            graph, _ = capture_graph(self._step, torch.cuda.graph_pool_handle())
            self.replay = graph.replay
        else:
            self.replay = self._step
        for layer, pending in zip(self.recurrent, saved):
            layer.pending = pending

    # -- the step, on the device --
    def _step(self) -> None:
        r, g, t = self.runner, self.drafter.graphs, self.t
        tm = r.buckets[-1]
        start, root, count = self.state[0:1], self.state[1:2], self.state[2:3]
        g.ints[1:2].copy_(root)
        drafts = g.device_pass(count)  # [B-1]
        ids = r.ints[:t]
        ids[0:1].copy_(root)
        ids[1:t].copy_(drafts[: t - 1])
        r.ints[tm : tm + t].copy_(self.depths)
        r.ints[2 * tm : 2 * tm + t].copy_(self.parents)
        r.ints[3 * tm : 3 * tm + 1].copy_(start)
        r.tree_mask[:t, :t].copy_(self.tril)
        out = r._run_static(t, verify=True)
        target = out.argmax[:t]  # [t]
        acc = (target[: t - 1] == ids[1:t]).long().cumprod(0).sum(0, keepdim=True)  # [1]
        bonus = target.gather(0, acc)  # [1]
        tokens = torch.cat((ids[1:t], bonus)).scatter(0, acc, bonus)  # drafts 1 .. a, the bonus at a
        self.result[0:1].copy_(acc)
        self.result[1:].copy_(tokens)
        if self.recurrent:  # commit along nodes 0 .. a (attention rows of a chain are already in place)
            o = 3 * tm + 1
            path = torch.minimum(self.depths, acc)
            r.ints[o : o + t].copy_(start + path)
            r.ints[o + tm : o + tm + t].copy_(start + self.depths)
            r.ints[o + 2 * tm : o + 2 * tm + 1].copy_(acc + 1)
            if r.k1:
                r.ints[o + 2 * tm + 1 : o + 2 * tm + 1 + r.k1].copy_(self.depths[: r.k1] + acc + 1)
            r._commit_static(t)
        g.ctx_in[:t].copy_(out.captured[:t])
        self.state[0:1].add_(acc + 1)
        self.state[1:2].copy_(bonus)
        self.state[2:3].copy_(acc + 1)

    # -- the host's side --
    def begin(self, root: int, start: int, rows: list[torch.Tensor], draft_len: int) -> None:
        """Load the state: the committed length, the root, the drafter's pending rows (<= B)."""
        g = self.drafter.graphs
        n = 0
        for row in rows:
            g.ctx_in[n : n + row.shape[0]].copy_(row)
            n += row.shape[0]
        if not 1 <= n <= g.block_size:
            raise RuntimeError(f"device chain: {n} pending draft rows, expected 1 .. {g.block_size}")
        hs = self.host_state
        hs[0], hs[1], hs[2], hs[3] = start, root, n, draft_len
        dev = self.state.device
        self.state.copy_(hs[:3].to(dev, non_blocking=True))
        g.ints[0:1].copy_(hs[3:4].to(dev, non_blocking=True))
        self.draft_len = draft_len
        self.count = n  # rows the next enqueued draft pass consumes (host's copy)

    def room(self, seq_len: int, max_len: int) -> bool:
        """Whether a step enqueued now fits, `seq_len` being the length before the step read last:
        the step in flight commits up to t, this one writes t more target rows, and its draft pass
        writes up to 2B draft rows past what the host knows."""
        g = self.drafter.graphs
        return seq_len + 2 * self.t <= max_len and self.draft_len + 3 * g.block_size + self.t < g.capacity - 1

    def enqueue(self) -> PendingStep:
        self.replay()
        host, event = self.ring[self._slot], self.events[self._slot]
        host.copy_(self.result, non_blocking=event is not None)
        if event is not None:
            event.record()
        self._slot ^= 1
        return PendingStep(host, event)

    def rows(self, n: int) -> torch.Tensor:
        """The draft rows the last read step left for the next pass (a copy)."""
        return self.drafter.graphs.ctx_in[:n].clone()
