"""DeviceStep: the DFlash drafter's DeviceLoop (spec/device_loop.py): chain or DDTree steps, greedy or
sampled, that never wait for the host.

A synchronous speculative step reads back twice (the drafts, then the target's tokens), and on the
H200's slow host every read-back leaves the GPU idle while the host launches the next graph: the
default SmolLM2 pair measured 0.54 ms per plain token against ~1.7-1.9 ms per drafted pass. Every
decision of a step can be made on the device, so one CUDA graph holds it all:

    draft    the DraftGraphs pass over the rows the last step committed (their count is known
             on the device only: the pass is padded to the block, see DFlashModel.forward_static)
    tree     the chain of top-1 drafts, or DDTree's best-first search in one program (kernels/spec/ddtree.py)
    verify   the target over the t nodes (the runner's `run_static`, over its `static_inputs`)
    target   the target's token at every node: its argmax (greedy), or one draw from the request's
             processed distribution (sampled: spec/sampling.processed_probs_static, and a
             counter-based hash for randomness, so the graph replays without generator state;
             without top-k and top-p, kernels/spec/sample.py draws with no sort, in its own graph)
    accept   node i is accepted when it and all its ancestors carry the target's token at their
             parent; the accepted nodes form the path, the target's token at its end is the bonus.
             Sampled, this is sample-and-match (spec/verify.py): each node's draw is independent,
             so drawing at every node and reading the visited ones is the same walk, and the
             output has the target's distribution for any tree
    commit   the runner's `commit_static` along the path (a chain on an attention-only target skips
             it: its path is a prefix, already in place)
    next     root = bonus, start += a + 1, the drafter's new rows = the verify's captured rows on the path

The state (start, root, row count) lives in device memory; the host enqueues step k + 1 before it
reads step k's result from a ring of two pinned buffers, and only keeps the books. Greedy drafts,
trees and verification are those of the synchronous path, so the tokens are too
(tests/spec/test_device_step.py, on the CPU with the graphs run eagerly); sampled steps are checked
against the exact distribution (tests/spec/test_device_sampling.py). Sampled trees are built from
the drafter's raw log-probabilities (the synchronous path uses the processed ones): another tree,
the same exactness.

    state   [3] long       start (committed target length), root token, count (new draft rows in ctx_in)
    result  [HEAD + t]     accepted a, the tree's depth, its draft nodes, then the emitted tokens:
                           the accepted drafts, the bonus, padding
"""

from __future__ import annotations


import torch

from treeflash.kernels.spec.accept import tree_accept
from treeflash.kernels.spec.ddtree import ddtree
from treeflash.kernels.spec.sample import sample_rows, sample_static
from treeflash.kv.recurrent_cache import RecurrentCache
from treeflash.models.runner import CudaGraphRunner, capture_graph
from treeflash.spec.device_loop import DeviceLoop, PendingStep, StepRead
from treeflash.spec.sampling import OFF_TOP_P, needs_order, processed_probs_static, static_params

# --budget auto on the device: one tree size in the captured graph (a graph per budget), and per step the
# request's bandit (bandit.py) between that tree and a plain step. 32 since stop 26 (docs/performance.md, "Stop 26"): on the default model 32 and 48
# are even on identical text (H200 step 1.104 against 1.144 ms, 3.6% more; fp32 tau 3.73 against 3.86,
# 3.5% more) and over the 20 held-out prompts in bf16 either has led by up to 5% (v8: 48, v9: 32), while
# on larger targets a 49-node verify costs more than a 33-node one (Qwen3.5-27B shape: verify-64 1.47x of
# the decode step against 1.32x at 32; Qwen3-8B 1.27x against 1.19x).
AUTO_BUDGET = 32
HEAD = 3
MAX_NODES = 63  # ancestor sets are int64 bitmasks


def supported(runner, drafter, want_logprobs) -> int:
    """The step's node count (budget + 1) when a DFlash drafter (`drafter`) can run device steps beside
    this runner, else 0."""
    if want_logprobs is not None or not isinstance(runner, CudaGraphRunner):
        return 0
    if drafter.graphs is None or tuple(runner.capture_layers) != tuple(drafter.capture_layers):
        return 0
    if drafter.tuner is not None:
        budget = min(AUTO_BUDGET, drafter.tuner.max_budget) if drafter.tree else drafter.max_depth
    else:
        budget = drafter.fixed_budget or 0
    t = budget + 1
    limit = min(runner.buckets[-1], MAX_NODES) if drafter.tree else min(drafter.graphs.block_size, runner.buckets[-1])
    if drafter.tree and drafter.graphs.top_k < budget:
        return 0
    return t if 2 <= t <= limit else 0


class DeviceStep(DeviceLoop):
    def __init__(self, runner: CudaGraphRunner, drafter, nodes: int, sampled: bool = False, filtered: bool = True):
        """Captures the step (a CUDA graph on a GPU) for `drafter`, the DFlashDrafter that owns it. Its
        warm-ups write scratch rows and advance recurrent state: build it before a prefill, which resets
        the caches. A sampled step with `filtered` applies top-k and top-p (a sort per node); without,
        it serves only requests that set neither (sampling.needs_order), and draws in one launch."""
        self.runner, self.drafter, self.t, self.nodes, self.sampled = runner, drafter, nodes, nodes, sampled
        self.guarded = drafter.tuner is not None  # --budget auto: a bandit between this step and a plain one
        self.policy = None  # this request's BudgetBandit (begin_request)
        self.step_s: dict[int, float] = {}  # the policy's prices: arm -> seconds (0: plain, t - 1: this step)
        self.measured_s: float | None = None  # this step's pipelined time, a moving average of `timed`
        self.filtered = sampled and filtered
        self.tree, self.seed_chain = drafter.tree, drafter.seed_chain
        g = drafter.graphs
        dev = runner.model.device
        t = nodes
        self.state = torch.zeros(3, dtype=torch.long, device=dev)
        vocab = runner.model.config.vocab_size
        self.fparams = torch.tensor([1.0, OFF_TOP_P, 0.0], device=dev)  # sampled: temperature, top_p, min_p
        self.iparams = torch.tensor([vocab, 0, 0], dtype=torch.long, device=dev)  # sampled: top_k, seed, counter
        self.result = torch.zeros(HEAD + t, dtype=torch.long, device=dev)
        self.node_ids = torch.arange(t, device=dev)
        self.chain_parents = self.node_ids - 1
        self.chain_anc = (2 << self.node_ids) - 1  # bits 0 .. i
        self.chain_real = torch.tensor([t], device=dev)
        self.tril = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        # a tree step's ancestor sets and real-node count (its ids, parents and depths go into the runner's ints)
        self.tree_bufs = (torch.zeros(t, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev))
        self.path = torch.zeros(t, dtype=torch.long, device=dev)  # a tree step's accepted path (tree_accept)
        self.recurrent = [layer for layer in runner.cache.layers if isinstance(layer, RecurrentCache)]
        pin = dev.type == "cuda"
        self.host_state = torch.zeros(7, dtype=torch.long, pin_memory=pin)
        self.host_fparams = torch.zeros(3, dtype=torch.float32, pin_memory=pin)
        self.ring = [torch.zeros(HEAD + t, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._slot = 0
        self._timer = None  # --budget auto: the runner's 1- and t-node verify, timed per context bucket
        self.draft_len = 0  # the draft cache length the host knows (the device runs ahead of it)
        self.count = 0  # rows the next read step's draft pass consumed
        saved = [layer.pending for layer in self.recurrent]
        self.state.copy_(torch.tensor([0, 0, 1]))  # warm-ups and capture write from slot 0: scratch until the reset
        g.ints[0] = 0
        step = self._tree_step if self.tree else self._chain_step
        if runner.use_graphs:
            graph, _ = capture_graph(step, torch.cuda.graph_pool_handle())
            self.replay = graph.replay
        else:
            self.replay = step
        for layer, pending in zip(self.recurrent, saved):
            layer.pending = pending

    # -- the step, on the device --
    def _chain_step(self) -> None:
        g, t = self.drafter.graphs, self.t
        start, root, count = self.state[0:1], self.state[1:2], self.state[2:3]
        g.ints[1:2].copy_(root)
        top_lp, top_ids = g.device_pass(count)  # [D, K]
        ids = torch.cat((root, top_ids[: t - 1, 0]))
        out = self._verify(ids, self.node_ids, self.chain_parents, self.tril, start)
        # a chain is the tree whose node i has parent i - 1 and ancestors 0 .. i
        # (attention rows of a chain are already in place: only recurrent state needs the commit)
        self._accept(out, ids, self.chain_parents, self.node_ids, self.chain_anc, self.chain_real, commit=bool(self.recurrent))

    def _tree_step(self) -> None:
        g, t = self.drafter.graphs, self.t
        start, root, count = self.state[0:1], self.state[1:2], self.state[2:3]
        g.ints[1:2].copy_(root)
        top_lp, top_ids = g.device_pass(count)  # [D, K]
        v = self.runner.static_inputs(t)
        # the tree straight into the verify's inputs: ids, parents and depths, the ancestor sets as its
        # tree mask (one launch, no copies)
        bufs = (v.ids, v.parents, v.depths, *self.tree_bufs)
        ids, parents, depths, anc, real = ddtree(top_lp, top_ids, root, t - 1, self.seed_chain, out=bufs, mask=v.tree_mask)
        v.start.copy_(start)
        out = self.runner.run_static(t, verify=True)
        self._accept(out, ids, parents, depths, anc, real, commit=True)

    def _accept(self, out, ids, parents, depths, anc, real, commit: bool) -> None:
        """After the verify: acceptance, the commit's inputs, the result row and the next state in one
        launch (kernels/spec/accept.py), then the runner's commit and the next pass's context rows."""
        g, r, t = self.drafter.graphs, self.runner, self.t
        v = r.static_inputs(t)
        # the commit's sources, destinations and path length straight into the runner's commit inputs
        tree_accept(ids, parents, depths, anc, real, self._targets(out), self.state, self.result, v.commit,
                    self.path, v.max_nodes, HEAD)
        if commit:
            r.stage_conv_rows(self.path, v.path_len)
            r.commit_static(t)
        m = min(t, g.block_size)
        torch.index_select(out.captured, 0, self.path[:m], out=g.ctx_in[:m])  # the next pass's context rows

    def _verify(self, ids, depths, parents, mask, start):
        t = self.t
        v = self.runner.static_inputs(t)
        v.ids.copy_(ids)
        v.depths.copy_(depths)
        v.parents.copy_(parents)
        v.start.copy_(start)
        v.tree_mask[:t, :t].copy_(mask)
        return self.runner.run_static(t, verify=True)

    def _targets(self, out) -> torch.Tensor:
        """[t] long: the target's token at each node (argmax, or a draw of the processed distribution)."""
        if not self.sampled:
            return out.argmax[: self.t]
        if self.filtered:
            probs = processed_probs_static(out.logits[: self.t], self.fparams, self.iparams[0:1])
            tokens = sample_static(probs, self.iparams[1:2], self.iparams[2:3], self.node_ids)
        else:  # temperature and min-p only: the same distribution without a sort
            tokens = sample_rows(out.logits[: self.t], self.fparams, self.iparams[1:2], self.iparams[2:3], self.node_ids)
        self.iparams[2:3].add_(1)  # the next step's draws
        return tokens

    # -- the host's side: the DeviceLoop protocol --
    def ready(self, seq_len: int, max_len: int) -> bool:
        """Entering needs the drafter's pending rows to fit one pass (not the prompt's) and room."""
        return 1 <= self.drafter.pending_rows() <= self.drafter.graphs.block_size and self.room(seq_len, max_len)

    def start(self, root: int, seq_len: int, params=None, seed: int = 0) -> None:
        """Load the state: the committed length, the root, the drafter's pending rows (<= B; it hands
        them over with its draft cache length), and for a sampled step the request's SamplingParams and
        a seed for its draws."""
        rows, draft_len = self.drafter.hand_over()
        g = self.drafter.graphs
        n = 0
        for row in rows:
            g.ctx_in[n : n + row.shape[0]].copy_(row)
            n += row.shape[0]
        if not 1 <= n <= g.block_size:
            raise RuntimeError(f"device steps: {n} pending draft rows, expected 1 .. {g.block_size}")
        hs = self.host_state.numpy()  # pinned: numpy writes, then non-blocking copies
        hs[:4] = seq_len, root, n, draft_len
        dev = self.state.device
        self.state.copy_(self.host_state[:3].to(dev, non_blocking=True))
        g.ints[0:1].copy_(self.host_state[3:4].to(dev, non_blocking=True))
        if self.sampled:
            if not self.filtered and needs_order(params):
                raise RuntimeError("device steps: this sampled step applies neither top-k nor top-p")
            floats, top_k = static_params(params, self.runner.model.config.vocab_size)
            self.host_fparams.numpy()[:] = floats
            hs[4:7] = top_k, seed & 0x7FFFFFFF, 0
            self.fparams.copy_(self.host_fparams.to(dev, non_blocking=True))
            self.iparams.copy_(self.host_state[4:7].to(dev, non_blocking=True))
        self.draft_len = draft_len
        self.count = n

    def room(self, seq_len: int, max_len: int) -> bool:
        """Whether a step enqueued now fits, `seq_len` being the length before the step read last:
        the step in flight commits up to B tokens, this one writes t more target rows, and its draft
        pass writes up to 2B draft rows past what the host knows."""
        g = self.drafter.graphs
        b = g.block_size
        return seq_len + b + self.t <= max_len and self.draft_len + 3 * b + 1 < g.capacity - 1

    def enqueue(self) -> PendingStep:
        self.replay()
        host, event = self.ring[self._slot], self.events[self._slot]
        host.copy_(self.result, non_blocking=event is not None)
        if event is not None:
            event.record()
        self._slot ^= 1
        return PendingStep(host, event)

    def read(self, pending: PendingStep) -> StepRead:
        """Wait for that step; the draft cache grew by the rows its pass consumed, and the next read
        step's pass consumes the accepted + 1 rows this one committed."""
        vals = pending.wait()
        a = vals[0]
        if self.policy is not None:
            self.policy.observe_count(self.t - 1, a)
        self.draft_len += self.count
        self.count = a + 1
        return StepRead(accepted=a, depth=vals[1], drafted=vals[2], tokens=vals[HEAD : HEAD + a + 1])

    def stop(self, observed: int) -> None:
        """The drafter takes back the rows the last read step left for the next pass (a copy), its
        draft cache length and the tokens observed."""
        self.drafter.take_back(self.drafter.graphs.ctx_in[: self.count].clone(), self.draft_len, observed)

    # -- --budget auto: the policy between this step and a plain one --
    def begin_request(self) -> None:
        self.policy = self.drafter.tuner.start_device(self.t - 1, self.policy)

    def choose(self, seq_len: int, in_flight: bool) -> bool:
        """The request's bandit: a device step (arm t - 1) or a plain one (arm 0), priced by the runner's
        one-node verify (timed when nothing is in flight) and this step's measured time (at first its
        t-node verify plus the drafter's propose time)."""
        if self.policy is None:
            self.begin_request()
        if not in_flight or not self.step_s:
            times = self._times(seq_len)
            self.step_s[0] = times.get(1, 0.0)
            model = times.get(self.t, 0.0) + self.drafter.tuner.draft_s
            self.step_s[self.t - 1] = model if self.measured_s is None else self.measured_s
        return self.policy.choose(self.step_s) > 0

    def observe_plain(self) -> None:
        self.policy.observe_plain()

    def timed(self, step_s: float) -> None:
        self.measured_s = step_s if self.measured_s is None else 0.8 * self.measured_s + 0.2 * step_s
        self.step_s[self.t - 1] = self.measured_s

    def _times(self, seq_len: int) -> dict[int, float]:
        """The runner's verify graph at 1 and t nodes, a few replays per context bucket and process. Call
        with nothing in flight: the replays overwrite buffers."""
        from treeflash.spec.budget import runner_verify_timer

        if self._timer is None:
            self._timer = runner_verify_timer(self.runner, node_counts=(1, self.t))
        self.drafter.own_pending()  # the observed rows may view the buffers the replays overwrite
        return self._timer(seq_len)
