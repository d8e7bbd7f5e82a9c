"""Runners execute the target over one ModelCache: eagerly (CPU; the reference), or by replaying
CUDA graphs captured per node-count bucket (GPU: the host spends ~50-80 us per launched op, so an
eager forward of a large model is host-bound; a graph replay launches the whole step at once).

Both expose the same two calls the decoder needs: `forward(step, ...)` and `commit(path)`.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
import torch

from treeflash.kernels.spec.commit import commit_rows_table
from treeflash.kv.cache import ModelCache
from treeflash.kv.recurrent_cache import RecurrentCache
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM, ForwardOutput


class EagerRunner:
    def __init__(self, model: CausalLM, cache: ModelCache):
        self.model, self.cache = model, cache

    def forward(self, step: StepInput, capture_layers: tuple[int, ...] = (), logits_at=None, compute_logits: bool = True) -> ForwardOutput:
        return self.model(step.to(self.model.device), self.cache, capture_layers, logits_at, compute_logits)

    def commit(self, path: list[int]) -> None:
        self.cache.commit(path)

    def abandon(self) -> None:
        """Drop a pending verify step without committing anything (used for timing)."""
        self.cache.rollback_pending()

    def static_verify(self, n: int) -> bool:
        """Whether a verify of n nodes at the cache's length runs a static (graph-captured) step; then a short
        prefill tail is cheaper as a chain verify than eagerly (Decoder.prefill). The eager runner has none."""
        return False


DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def capture_graph(fn, pool, warmups: int = 2):
    """Run `fn` `warmups` times on a side stream (kernel selection, cuBLAS handles, allocations stay
    out of the graph), then capture one call into a CUDA graph drawing on `pool`.
    Returns (graph, what the captured call returned: its static outputs).

    The side stream is torch's own capture stream, one for every capture: cuBLAS keeps a workspace per
    (handle, stream) for the process's life, so a new stream per capture held one more workspace for
    each of the ~26 graphs a DFlash engine captures."""
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.graph(graph, pool=pool)
    stream = capture.capture_stream
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    # no garbage collection while capturing: torch no longer collects before a capture, and a dead
    # cycle holding an earlier runner's graphs, freed mid-capture, destroys them inside the capture
    # ("operation not permitted when stream is capturing") and invalidates it (gpu_check's qwen3_5
    # DFlash drafter capture failed so after earlier decoders' runners became garbage; alone it passes)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with capture:
            out = fn()
    finally:
        if enabled:
            gc.enable()
    return graph, out


@dataclass
class PendingToken:
    """A greedy token a step computed, on its way to the host: `token()` waits for that step only."""

    host: torch.Tensor  # [1] long, pinned on a GPU host
    event: object = None  # torch.cuda.Event recorded after the device-to-host copy (None: already there)

    def token(self) -> int:
        if self.event is not None:
            self.event.synchronize()
        return int(self.host[0])


@dataclass(frozen=True)
class StaticInputs:
    """A graph runner's static inputs for a step of t nodes, as views of its packed device buffers."""

    ids: torch.Tensor  # [t] long: node tokens
    depths: torch.Tensor  # [t] long
    parents: torch.Tensor  # [t] long, -1 for the root
    start: torch.Tensor  # [1] long: the committed length before the step
    tree_mask: torch.Tensor  # [max_nodes, max_nodes] bool: the verify's [:t, :t] (row-contiguous)
    # the commit's inputs packed: src at [0:t], dest at [max_nodes:], path_len at [2 max_nodes], then
    # the conv rows (kernels/accept.tree_accept writes the first three in one launch)
    commit: torch.Tensor  # [2 max_nodes + 1 + k1] long
    max_nodes: int  # the largest bucket: the stride of `commit`'s parts
    commit_src: torch.Tensor  # [t] long: cache slots of the kept path (start + node), padded with its end
    commit_dest: torch.Tensor  # [t] long: where they go (start + 0 .. t-1)
    path_len: torch.Tensor  # [1] long
    conv_rows: torch.Tensor  # [k1] long: the recurrent conv window's rows after the commit (stage_conv_rows)


@dataclass
class _Graph:
    replay: object  # () -> None: a CUDA graph's replay, or (static mode without graphs) the eager call
    logits: torch.Tensor | None  # [T, vocab] fp32 (static output)
    captured: torch.Tensor | None  # [T, C]
    pending: list  # per recurrent layer: the PendingNodes whose tensors the graph writes
    commit: object = None  # () -> None
    argmax: torch.Tensor | None = None  # [T] long (static output)


class CudaGraphRunner(EagerRunner):
    """Plain decode (T=1) and verify at node-count buckets, each a captured CUDA graph.

    Static inputs are filled with one host-to-device copy per step; a verify of n nodes replays the
    smallest bucket >= n (padding nodes are children of the root that nothing sees and nobody
    commits). Commit is a graph too: attention KV of the kept path is copied into contiguous slots
    and each recurrent layer replays the decode step along the kept path. Prefill runs eagerly.
    """

    def __init__(self, model: CausalLM, cache: ModelCache, capture_layers: tuple[int, ...] = (), buckets=DEFAULT_BUCKETS,
                 decode_graph: bool = True, use_graphs: bool | None = None):
        super().__init__(model, cache)
        dev = model.device
        # use_graphs=False runs the same static-shape code eagerly (how the CPU tests check it)
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        self.capture_layers = capture_layers
        self.buckets = tuple(sorted(buckets))
        tmax = self.buckets[-1]
        self.max_len = cache.max_len
        # the commit moves the dense attention layers' kept rows in one launch (kernels/spec/commit.py)
        self.commit_table, self.commit_layers = cache.dense_row_table()
        # static inputs: [ids | depths | parents | start | commit_src | commit_dest | path_len | conv_idx]
        self.k1 = (cache.layout.recurrent.conv_kernel - 1) if cache.layout.recurrent else 0
        self.n_int = 3 * tmax + 1 + 2 * tmax + 1 + max(self.k1, 1)
        pin = dev.type == "cuda"
        self.host_ints = torch.zeros(self.n_int, dtype=torch.long, pin_memory=pin)
        self.host_mask = torch.zeros(tmax, tmax, dtype=torch.bool, pin_memory=pin)
        # numpy views of the same (pinned) memory: the host fills them between two graphs of a
        # speculative step, where each torch indexing op costs microseconds and numpy's far less
        self._hi, self._hm = self.host_ints.numpy(), self.host_mask.numpy()
        self.ints = torch.zeros(self.n_int, dtype=torch.long, device=dev)
        self.tree_mask = torch.zeros(tmax, tmax, dtype=torch.bool, device=dev)
        self.key_pos = torch.arange(self.max_len, device=dev)
        self.node_pos = torch.arange(tmax, device=dev)
        self._conv_taps = torch.arange(self.k1, device=dev)
        # enqueue_greedy's own pinned buffers (a ring of 2: step k + 1 is enqueued before step k is read)
        self.ahead_start = [torch.zeros(1, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.ahead_token = [torch.zeros(1, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.ahead_events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._ring = 0
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graphs: dict[int, _Graph] = {}
        self.decode: _Graph | None = None
        self._last_bucket: int | None = None
        self._capture_all(decode_graph)

    # -- the static inputs, by name (what a device loop writes before run_static / commit_static) --
    def static_inputs(self, t: int) -> StaticInputs:
        """Views of the packed static inputs for a step of t nodes (one host-to-device copy fills them all)."""
        tm = self.buckets[-1]
        ints = self.ints
        o = 3 * tm + 1
        return StaticInputs(
            ids=ints[:t], depths=ints[tm : tm + t], parents=ints[2 * tm : 2 * tm + t], start=ints[3 * tm : 3 * tm + 1],
            tree_mask=self.tree_mask, commit=ints[o:], max_nodes=tm, commit_src=ints[o : o + t],
            commit_dest=ints[o + tm : o + tm + t], path_len=ints[o + 2 * tm : o + 2 * tm + 1],
            conv_rows=ints[o + 2 * tm + 1 : o + 2 * tm + 1 + self.k1])

    def _static_step(self, t: int, verify: bool) -> StepInput:
        v = self.static_inputs(t)
        ids, depths, parents, start = v.ids, v.depths, v.parents, v.start
        slots = start + self.node_pos[:t]
        if verify:
            tm = self.tree_mask[:t, :t]
            key_mask = (self.key_pos[None, :] < start).expand(t, -1).clone()
            key_mask.index_copy_(1, slots, tm)
            return StepInput(ids, start + depths, -1, parents, tm, depths, slots, key_mask)
        key_mask = (self.key_pos[None, :] <= start).expand(t, -1)
        return StepInput(ids, start + depths, -1, None, None, None, slots, key_mask)

    def run_static(self, t: int, verify: bool = True) -> ForwardOutput:
        """The static-shape step over the static inputs (what a graph captures; a device loop calls it
        inside its own graph): logits [t, vocab] fp32, captured rows, and the argmax [t] long."""
        out = self.model.forward_layers(self._static_step(t, verify), self.cache, self.capture_layers)
        out.argmax = out.logits.argmax(-1)  # in the graph: a greedy step reads back tokens, not a launch more
        return out

    def stage_conv_rows(self, path: torch.Tensor, path_len: torch.Tensor) -> None:
        """The recurrent conv window's rows for a commit along `path` ([t] long node ids on the device,
        padded past `path_len` [1]): rows 0 .. k1-1 are the committed window, k1 + i node i; the last
        k1 of the window-then-path sequence (graph-safe: no host value)."""
        if not self.k1:
            return
        idx = self._conv_taps + path_len
        self.static_inputs(0).conv_rows.copy_(torch.where(idx < self.k1, idx, self.k1 + path.gather(0, (idx - self.k1).clamp_min(0))))

    def stage_commit(self, t: int, path: torch.Tensor, path_len: torch.Tensor) -> None:
        """All of commit_static's inputs from a device path ([t] long node ids, padded with its last
        node past path_len [1]): the kept rows' sources and destinations and the conv window's rows."""
        v = self.static_inputs(t)
        v.commit_src.copy_(v.start + path)
        v.commit_dest.copy_(v.start + self.node_pos[:t])
        v.path_len.copy_(path_len)
        self.stage_conv_rows(path, path_len)

    def _capture(self, t: int, verify: bool) -> _Graph:
        if not self.use_graphs:
            g = _Graph(None, None, None, [])

            def replay():
                out = self.run_static(t, verify)
                g.logits, g.captured, g.argmax = out.logits, out.captured, out.argmax
                g.pending = [l.pending for l in self.cache.layers if isinstance(l, RecurrentCache)]

            g.replay = replay
            g.commit = lambda: self.commit_static(t)
            return g
        graph, out = capture_graph(lambda: self.run_static(t, verify), self.pool)
        pending = []
        for layer in self.cache.layers:
            if isinstance(layer, RecurrentCache):
                pending.append(layer.pending)
                layer.drop_pending()
        g = _Graph(graph.replay, out.logits, out.captured, pending, argmax=out.argmax)
        if verify:
            g.commit = self._capture_commit(t, g)
        return g

    def commit_static(self, t: int) -> None:
        """Keep the staged path of the last static step of t nodes (static_inputs' commit views)."""
        v = self.static_inputs(t)
        start, src, dest, path_len, conv_idx = v.start, v.commit_src, v.commit_dest, v.path_len, v.conv_rows
        path = src - start  # [t] node ids, padded past path_len
        for i, layer in enumerate(self.cache.layers):
            if isinstance(layer, RecurrentCache):
                layer.commit_path(path, path_len, conv_idx)
            elif i not in self.commit_layers:
                layer.commit_static(dest, src, path_len)
        if self.commit_table is not None:  # the dense attention layers' K and V, one launch for all
            commit_rows_table(self.commit_table, dest, src, path_len)

    def _capture_commit(self, t: int, g: _Graph):
        self._install(g)

        graph, _ = capture_graph(lambda: self.commit_static(t), self.pool, warmups=1)
        return graph.replay

    def _install(self, g: _Graph) -> None:
        layers = [layer for layer in self.cache.layers if isinstance(layer, RecurrentCache)]
        for layer, pending in zip(layers, g.pending):
            layer.pending = pending

    @torch.inference_mode()
    def _capture_all(self, decode_graph: bool) -> None:
        saved = self.cache.seq_len
        # capture over slot 0.. with start 0; the cache is reset afterwards
        self.ints.zero_()
        self.tree_mask.copy_(torch.ones_like(self.tree_mask).tril())
        if decode_graph:
            self.decode = self._capture(1, verify=False)
        for t in self.buckets:
            self.graphs[t] = self._capture(t, verify=True)
        self.cache.reset()
        self.cache.seq_len = saved

    def _upload(self, step: StepInput) -> None:
        self.ints.copy_(self.host_ints, non_blocking=True)
        if step.is_verify:  # a decode step reads no tree mask
            self.tree_mask.copy_(self.host_mask, non_blocking=True)

    def forward(self, step: StepInput, capture_layers: tuple[int, ...] = (), logits_at=None, compute_logits: bool = True) -> ForwardOutput:
        n = step.num_tokens
        graphed = tuple(capture_layers) == tuple(self.capture_layers) and compute_logits and logits_at is None
        if not graphed or (not step.is_verify and (n != 1 or self.decode is None)) or n > self.buckets[-1]:
            return super().forward(step, capture_layers, logits_at, compute_logits)  # prefill and odd shapes
        cache = self.cache
        t = 1 if not step.is_verify else next(b for b in self.buckets if b >= n)
        if cache.seq_len + t > self.max_len:  # the bucket's padding nodes would write past the cache's end
            return super().forward(step, capture_layers, logits_at, compute_logits)
        cache.begin(n, verify=step.is_verify)
        tm = self.buckets[-1]
        h = self._hi  # numpy view of host_ints
        h[:n] = step.input_ids.cpu().numpy()
        h[n:t] = 0
        if step.is_verify:
            h[tm : tm + n] = step.depths.cpu().numpy()
            h[tm + n : tm + t] = 1  # padding nodes: children of the root that no real node sees
            h[2 * tm : 2 * tm + n] = step.parents.cpu().numpy()
            h[2 * tm + n : 2 * tm + t] = 0
            m = self._hm  # numpy view of host_mask
            m[:n, :n] = step.tree_mask.cpu().numpy()
            m[n:t, :t] = False
            m[:t, n:t] = False
            if t > n:  # padding nodes see the root and themselves
                pad = np.arange(n, t)
                m[pad, 0] = True
                m[pad, pad] = True
        else:
            h[tm] = 0
        h[3 * tm] = cache.seq_len
        self._upload(step)
        g = self.graphs[t] if step.is_verify else self.decode
        g.replay()
        if step.is_verify:
            self._last_bucket = t
            self._install(g)
        else:
            cache.end_plain(1)
        logits = g.logits[:n]
        captured = g.captured[:n] if g.captured is not None else None
        return ForwardOutput(logits=logits, hidden=logits.new_empty(0), captured=captured, argmax=g.argmax[:n])

    def static_verify(self, n: int) -> bool:
        if not 1 <= n <= self.buckets[-1]:
            return False
        return self.cache.seq_len + next(b for b in self.buckets if b >= n) <= self.max_len

    def enqueue_greedy(self, token: int | None) -> PendingToken:
        """Enqueue one greedy decode step without waiting for it. Its input is `token` (from the host)
        or, with None, the greedy token of the step enqueued just before, taken on the device, so the
        host can enqueue step k + 1 before it reads step k's token and the GPU never waits for the host.

        The caller reads each PendingToken before enqueueing two more steps (a ring of two pinned
        buffers). A step enqueued ahead advances the cache (its KV row, the recurrent state) whether
        or not its token is wanted: a sequence that stops leaves one extra step in the cache, which
        the next prefill resets. Captured layers (a drafter's) are computed and not kept: the caller
        drafts no more in this sequence."""
        cache = self.cache
        if self.decode is None:
            raise RuntimeError("enqueue_greedy needs the decode graph")
        if token is not None:  # through the decode graph (its argmax feeds the next step), captured layers and all
            self.forward(StepInput.plain(torch.tensor([token], dtype=torch.long), cache.seq_len), self.capture_layers)
        else:
            tm = self.buckets[-1]
            start = self.ahead_start[self._ring]
            start[0] = cache.seq_len  # safe to rewrite: its last copy preceded a step the host has read
            cache.begin(1, verify=False)
            self.ints[3 * tm : 3 * tm + 1].copy_(start, non_blocking=True)
            self.ints[0:1].copy_(self.decode.argmax[:1])  # the previous step's token, device to device
            self.decode.replay()
            cache.end_plain(1)
        host, event = self.ahead_token[self._ring], self.ahead_events[self._ring]
        host.copy_(self.decode.argmax[:1], non_blocking=event is not None)
        if event is not None:
            event.record()
        self._ring ^= 1
        return PendingToken(host, event)

    def abandon(self) -> None:
        self._last_bucket = None
        self.cache.pending = 0

    def commit(self, path: list[int]) -> None:
        cache = self.cache
        if self._last_bucket is None:
            return cache.commit(path)
        t, self._last_bucket = self._last_bucket, None
        tm = self.buckets[-1]
        h = self._hi  # numpy view of host_ints
        o = 3 * tm + 1
        start = cache.seq_len
        h[o : o + len(path)] = path
        h[o + len(path) : o + t] = path[-1]
        h[o : o + t] += start
        h[o + tm : o + tm + t] = np.arange(start, start + t)
        h[o + 2 * tm] = len(path)
        if self.k1:
            rows = list(range(self.k1)) + [self.k1 + p for p in path]
            h[o + 2 * tm + 1 : o + 2 * tm + 1 + self.k1] = rows[-self.k1 :]
        self.ints.copy_(self.host_ints, non_blocking=True)
        self._install(self.graphs[t])
        self.graphs[t].commit()
        cache.seq_len += len(path)
        cache.pending = 0
