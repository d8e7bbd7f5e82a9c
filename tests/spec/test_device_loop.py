"""A drafter that wants the GPU fast path implements the declared protocol (spec/device_loop.py) in
its own file and touches no other drafter's code: this one drafts the reference continuation (every
seventh position wrong), on the host for synchronous steps and inside its own DeviceLoop for device
steps, which writes the runner's static inputs by name and keeps its own books. Through the Decoder
(the static code run eagerly on the CPU, as a GPU would replay it) the tokens equal the target alone's,
both ways, with the same acceptance; partial and full acceptance both occur."""

from __future__ import annotations

import pytest
import torch

from tests.models.hf_oracle import make_pair
from tests.spec.test_lossless_greedy import run
from treeflash.models.runner import CudaGraphRunner
from treeflash.spec.decoder import Decoder
from treeflash.spec.device_loop import DeviceLoop, PendingStep, StepRead
from treeflash.spec.drafter import DraftContext, Drafter
from treeflash.spec.sampling import SamplingParams
from treeflash.spec.tree import DraftTree

PROMPT = [5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
N = 80
CORRUPT_EVERY = 7  # with 4 drafts a step: some steps accept all, some stop early


class ChainLoop(DeviceLoop):
    """A chain of `nodes - 1` drafts per step, drafted, verified, accepted and committed with device ops
    only (no host value inside the step): graph-safe. Result row: [accepted, emitted tokens...]."""

    sampled = False

    def __init__(self, runner: CudaGraphRunner, full: torch.Tensor, nodes: int):
        dev = runner.model.device
        self.runner, self.nodes = runner, nodes
        self.full = full.to(dev)  # [L] long: the reference sequence (prompt + continuation), padded
        self.vocab = runner.model.config.vocab_size
        self.state = torch.zeros(2, dtype=torch.long, device=dev)  # start (committed length), root
        self.node = torch.arange(nodes, device=dev)
        self.tril = torch.ones(nodes, nodes, dtype=torch.bool, device=dev).tril()
        self.result = torch.zeros(1 + nodes, dtype=torch.long, device=dev)
        self.host = torch.zeros(1 + nodes, dtype=torch.long)
        self.steps = 0

    def _step(self) -> None:
        t = self.nodes
        start, root = self.state[0:1], self.state[1:2]
        pos = start + self.node[1:]  # the drafts' positions
        drafts = self.full.gather(0, pos)
        drafts = torch.where(pos % CORRUPT_EVERY == 0, (drafts + 1) % self.vocab, drafts)
        ids = torch.cat((root, drafts))
        v = self.runner.static_inputs(t)
        v.ids.copy_(ids)
        v.depths.copy_(self.node)
        v.parents.copy_(self.node - 1)
        v.start.copy_(start)
        v.tree_mask[:t, :t].copy_(self.tril)
        target = self.runner.run_static(t, verify=True).argmax[:t]
        accepted = torch.cumprod((ids[1:] == target[:-1]).long(), 0).sum(0, keepdim=True)  # [1]
        bonus = target.gather(0, accepted)
        emitted = torch.where(self.node < accepted, ids.gather(0, (self.node + 1).clamp_max(t - 1)), bonus)
        self.result.copy_(torch.cat((accepted, emitted)))
        self.runner.stage_commit(t, torch.minimum(self.node, accepted), accepted + 1)  # the path 0 .. accepted
        self.runner.commit_static(t)
        self.state.copy_(torch.cat((start + accepted + 1, bonus)))

    def ready(self, seq_len: int, max_len: int) -> bool:
        return self.room(seq_len, max_len)

    def start(self, root: int, seq_len: int, params, seed: int) -> None:
        self.state.copy_(torch.tensor([seq_len, root]))

    def enqueue(self) -> PendingStep:
        self._step()
        self.steps += 1
        self.host.copy_(self.result)
        return PendingStep(self.host.clone(), None)

    def room(self, seq_len: int, max_len: int) -> bool:
        return seq_len + 2 * self.nodes <= max_len  # the step in flight, then this one's rows

    def read(self, pending: PendingStep) -> StepRead:
        vals = pending.wait()
        a = vals[0]
        return StepRead(accepted=a, depth=self.nodes - 1, drafted=self.nodes - 1, tokens=vals[1 : a + 2])

    def stop(self, observed: int) -> None:
        pass  # the drafts come from the reference: nothing to hand back


class ChainLoopDrafter(Drafter):
    """The same drafts on the host (synchronous steps) and in ChainLoop (device steps)."""

    name = "chain_loop"

    def __init__(self, full: list[int], depth: int, vocab: int, device_steps: bool = True):
        self.full, self.depth, self.vocab, self.device_steps = full + [0] * 64, depth, vocab, device_steps
        self.loop: ChainLoop | None = None

    def propose(self, ctx: DraftContext) -> DraftTree:
        n = len(ctx.tokens)
        depth = min(self.depth, ctx.max_nodes - 1)
        drafts = [self.full[p] if p % CORRUPT_EVERY else (self.full[p] + 1) % self.vocab for p in range(n + 1, n + 1 + depth)]
        return DraftTree.chain(ctx.root, drafts)

    def device_loop(self, runner, params: SamplingParams, want_logprobs):
        if not self.device_steps or not params.greedy or want_logprobs is not None:
            return None
        if self.loop is None or self.loop.runner is not runner:
            self.loop = ChainLoop(runner, torch.tensor(self.full), self.depth + 1)
        return self.loop


def decode(target, drafter, n: int, device_steps: bool = True):
    cache = target.new_cache(len(PROMPT) + n + 40)
    runner = CudaGraphRunner(target, cache, use_graphs=False)
    drafter.bind_runner(runner)
    dec = Decoder(target, cache, SamplingParams(), drafter, runner=runner, device_steps=device_steps)
    out = [dec.prefill(PROMPT)]
    while len(out) < n:
        out.extend(dec.step())
    return out[:n], dec.stats


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])  # attention only, and hybrid (the recurrent commit)
def test_a_new_drafter_runs_its_own_device_loop_losslessly(arch):
    _, target = make_pair(arch)
    ref, _ = run(target, PROMPT, N)
    full = PROMPT + ref  # the reference sequence: its token at position len(tokens) is the root
    drafter = ChainLoopDrafter(full, 4, target.config.vocab_size)
    out, stats = decode(target, drafter, N)
    sync_drafter = ChainLoopDrafter(full, 4, target.config.vocab_size, device_steps=False)
    sync_out, sync_stats = decode(target, sync_drafter, N, device_steps=False)
    assert out == sync_out == ref
    assert drafter.loop is not None and drafter.loop.steps > 5 and sync_drafter.loop is None
    # the same drafts, accepted the same way, whichever side of the protocol ran them
    assert (stats.passes, stats.committed, stats.accepted_per_depth) == (
        sync_stats.passes, sync_stats.committed, sync_stats.accepted_per_depth)
    assert 0 < stats.accepted_per_depth[-1] < stats.accepted_per_depth[0]  # full and partial acceptance
