"""Decoder: runs one sequence through the target, plainly or speculatively.

`prefill` commits the prompt and samples the first token (the root). Each `step` is one of three:
- plain: one token through the target (no drafter, or drafting off for this request);
- device: the drafter's DeviceLoop (spec/device_loop.py) ran the whole drafted step on the device;
  the host reads what it committed and keeps the books;
- drafted: propose a draft tree, build the verify batch, run the target once, accept, commit the
  KV cache and recurrent state, emit the committed tokens (accepted drafts + bonus).

A constrained request (a grammar, min_tokens: spec/constraint.py) masks the target's logits at
every token it picks: prefill's, each plain step's, and in drafted steps each visited node's before
the acceptance rule, after the nodes the constraint forbids were pruned from the tree
(spec/constrained_tree.py). It never runs device steps (the DeviceLoop has no masks) nor the
pipelined greedy plain steps (their argmax is the unmasked one): those run on the host, exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from treeflash.kv.cache import ModelCache
from treeflash.models.runner import EagerRunner
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM
from treeflash.spec.constrained_tree import NodeMasks, prune
from treeflash.spec.constraint import Constraint, masked
from treeflash.spec.device_loop import DeviceLoop, PendingStep
from treeflash.spec.drafter import DraftContext, Drafter
from treeflash.spec.sampling import SamplingParams, pick
from treeflash.spec.stats import SpecStats
from treeflash.spec.tree import DraftTree
from treeflash.spec.verify import uses_draft_probs, verify


class Decoder:
    def __init__(
        self,
        target: CausalLM,
        cache: ModelCache,
        params: SamplingParams,
        drafter: Drafter | None = None,
        generator: torch.Generator | None = None,
        want_logprobs: int | None = None,
        runner: EagerRunner | None = None,
        device_steps: bool = True,
        constraint: Constraint | None = None,
        end_ids: frozenset[int] = frozenset(),
        keep_prompt_hidden: bool = False,
    ):
        """device_steps: drafted steps run on the device where the drafter and runner can (False: the
        synchronous steps, the A/B baseline; exact either way). constraint: the request's (prefill
        resets it to the empty output); end_ids: the tokens that end the output (the constraint is not advanced
        past one); keep_prompt_hidden: keep the prompt's captured rows after prefill (`prompt_hidden`, for a
        prefix cache), else each chunk's rows go to the drafter and are dropped."""
        self.target, self.cache, self.params, self.drafter = target, cache, params, drafter
        self.runner = runner if runner is not None else EagerRunner(target, cache)
        self.want_logprobs = want_logprobs  # None = off; k = also the top k alternatives
        self.device_steps = device_steps and constraint is None
        self.constraint, self.end_ids = constraint, end_ids
        self._ended = False  # an end token was emitted: the constraint stays where it was
        self.last_logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
        self.generator = generator if generator is not None else params.generator()
        self.stats = SpecStats()
        self.tokens: list[int] = []  # committed tokens (prompt + output, root excluded)
        self.root: int | None = None
        self.keep_prompt_hidden = keep_prompt_hidden
        self.prompt_hidden: torch.Tensor | None = None  # the prompt's captured rows after prefill (keep_prompt_hidden)
        self.resumed = 0  # prompt tokens the last prefill resumed instead of prefilling
        self._ahead = None  # PendingToken of a plain step enqueued before its input was read back
        self._dev: DeviceLoop | None = None  # the drafter's device loop for this request (None: synchronous steps)
        self._dev_cur: PendingStep | None = None  # its step enqueued, not read yet
        self._dev_plain = False  # a guarded loop chose a plain step for this step (--budget auto)
        self._dev_read_at: float | None = None  # when the loop's last step was read, within a run

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens the cache's committed rows hold: `tokens`, and the root too when a pipelined plain step
        enqueued ahead has already consumed it (the cache is one row past the output: the prefix cache keeps it)."""
        return self.tokens + [self.root] if self._ahead is not None else self.tokens

    @property
    def capture(self) -> tuple[int, ...]:
        return self.drafter.capture_layers if self.drafter is not None else ()

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], chunk: int = 2048, start: int = 0, hidden_before: torch.Tensor | None = None,
                stops: tuple[int, ...] = (), on_stop: Callable[[int], None] | None = None) -> int:
        """Commit the prompt; return the first sampled token (the root of the first step).

        The prefix-cache hook (engine/prefix_cache.py): with start > 0 the first `start` prompt
        tokens are already committed (the cache was resumed there: cache.seq_len == start) and
        `hidden_before` [start, ...] are their captured rows for the drafter. Chunks end at
        multiples of `chunk` and at each position in `stops`; on_stop(position) runs after each of those."""
        self._ahead = None  # a step left enqueued by an earlier sequence is reset with the cache
        self._dev_cur = None
        self._dev = None  # built (captured) before the reset below
        if self.drafter is not None and self.device_steps:
            self._dev = self.drafter.device_loop(self.runner, self.params, self.want_logprobs)
        if self._dev is not None and self._dev.guarded:
            self._dev.begin_request()
        self._dev_plain = False
        self._dev_read_at = None
        if self._dev is not None and self._dev.first_use() and start:  # its capture's warm-ups wrote over the resumed rows
            start, hidden_before = 0, None
        self.resumed = start  # prompt tokens not prefilled again
        if start:
            assert self.cache.seq_len == start < len(prompt_ids), "resume the cache at start, and leave a token to prefill"
        else:
            self.cache.reset()
        if self.drafter is not None:
            self.drafter.reset()
            if start:
                self.drafter.observe_prompt(list(prompt_ids[:start]), hidden_before)
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=self.target.device)
        hidden_parts = [hidden_before] if hidden_before is not None and self.keep_prompt_hidden else []
        n = len(prompt_ids)
        ends = sorted({*range(chunk, n, chunk), *(p for p in stops if start < p < n), n} - set(range(start + 1)))
        s = start
        for e in ends:
            part = ids[s:e]
            last = e == n
            if last and s > 0 and self.runner.static_verify(e - s):
                out = self._chain_tail(prompt_ids[s:e])
            else:
                out = self.runner.forward(
                    StepInput.plain(part, self.cache.seq_len),
                    capture_layers=self.capture,
                    logits_at=torch.tensor([part.shape[0] - 1], device=ids.device) if last else None,
                    compute_logits=last,
                )
            if out.captured is not None and self.keep_prompt_hidden:
                hidden_parts.append(out.captured)
            if self.drafter is not None:  # chunk by chunk: the drafter takes a chunk's rows before the next one
                self.drafter.observe_prompt(list(prompt_ids[s:e]), out.captured)
            if on_stop is not None and e in stops:
                on_stop(e)
            s = e
        self.tokens = list(prompt_ids)
        self.prompt_hidden = torch.cat(hidden_parts) if hidden_parts else None  # [len(prompt), ...] captured rows, or None
        self._ended = False
        if self.constraint is not None:
            self.constraint.reset()
        self.root = int(pick(self._masked(out.logits), self.params, self.generator)[0])
        self._logprobs(out.logits, [self.root])
        self._advance([self.root])
        return self.root

    def _chain_tail(self, tail: list[int]):
        """The prompt's last tokens after a resumed or prefilled start, as one verify of a chain, committed whole:
        a graph replay where an eager prefill of a few tokens costs a launch per op (the prefix-cache hit's tail).
        The same rows and states as a prefill chunk (other kernels: the floating-point order differs). -> the
        output with the last token's logits [1, vocab]."""
        n = len(tail)
        step = StepInput.tree(torch.tensor(tail, dtype=torch.long), list(range(-1, n - 1)), self.cache.seq_len)
        out = self.runner.forward(step, capture_layers=self.capture)
        logits, captured = out.logits[n - 1 : n].clone(), None if out.captured is None else out.captured[:n].clone()
        self.runner.commit(list(range(n)))
        return type(out)(logits=logits, hidden=out.hidden, captured=captured)

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One target pass; returns the tokens it commits after the root (accepted drafts + bonus)."""
        assert self.root is not None, "prefill first"
        if self.drafter is None:
            return self._plain_step()
        if self._dev_cur is not None or self._device_ready():
            return self._device_step()
        if self._dev_plain:  # the loop's policy chose a plain step (it still feeds the drafter)
            return self._plain_step()
        return self._drafted_step()

    def _drafted_step(self) -> list[int]:
        t0 = time.perf_counter()
        room = self.cache.max_len - self.cache.seq_len
        ctx = DraftContext(self.tokens, self.root, self.params, self.generator, max_nodes=room)
        tree = _fit(self.drafter.propose(ctx), room)  # propose a draft tree
        if self._constrained:  # drop the drafts the constraint forbids before they cost budget
            tree = prune(tree, self.constraint, self.end_ids, keep_forbidden=uses_draft_probs(tree, self.params))
        t1 = time.perf_counter()
        if tree.num_nodes == 1:  # nothing drafted (budget 0): a plain decode step, hidden states kept
            return self._plain_step(draft_s=t1 - t0)
        batch = StepInput.tree(tree.token_ids, tree.parents, self.cache.seq_len)  # build the verify batch
        out = self.runner.forward(batch, capture_layers=self.capture)  # run the target once
        masks = NodeMasks(tree, self.constraint, self.end_ids) if self._constrained else None
        result = verify(tree, out.logits, self.params, self.generator, argmax=out.argmax if masks is None else None,
                        masks=masks)  # accept
        if masks is not None:
            masks.close()
        self.runner.commit(result.path)  # commit KV and recurrent state
        t2 = time.perf_counter()
        committed = [self.root, *result.tokens[:-1]]
        self.tokens.extend(committed)
        self.drafter.observe(committed, _rows(out.captured, result.path))
        self.root = result.tokens[-1]
        self._advance(result.tokens)
        if self.want_logprobs is not None:
            self._logprobs(out.logits[torch.tensor(result.path, device=out.logits.device)], result.tokens)
        t3 = time.perf_counter()
        self.stats.draft_s += t1 - t0
        self.stats.verify_s += t2 - t1
        self.stats.rest_s += t3 - t2
        self.stats.record(max(tree.depths()), result.num_accepted, tree.budget)
        return result.tokens  # emit

    # -- drafted steps on the device (the drafter's DeviceLoop) --

    def _device_ready(self) -> bool:
        """Whether the next step runs on the device; a guarded loop's policy may choose a plain step."""
        self._dev_plain = False
        if self._dev is None or not self._dev.ready(self.cache.seq_len, self.cache.max_len):
            return False
        if self._dev.guarded and not self._dev.choose(self.cache.seq_len, in_flight=False):
            self._dev_plain = True
            self._dev.observe_plain()
            return False
        return True

    def _device_step(self) -> list[int]:
        """Read the step enqueued last, after enqueueing the next one; the host only keeps the books.
        Without room for another step, or when a guarded loop's policy chooses a plain step next, the
        run ends and the drafter takes its state back."""
        t0 = time.perf_counter()
        loop = self._dev
        if self._dev_cur is None:  # entering: load the state, enqueue the first step
            seed = 0
            if loop.sampled:  # the device draws from a hash of (seed, step, node): the seed comes from the request's generator
                seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator, device=self.generator.device))
            loop.start(self.root, self.cache.seq_len, self.params, seed)
            self._dev_read_at = None
            self._dev_cur = loop.enqueue()
        cur = self._dev_cur
        go_on = loop.room(self.cache.seq_len, self.cache.max_len) and (
            not loop.guarded or loop.choose(self.cache.seq_len, in_flight=True))
        self._dev_cur = loop.enqueue() if go_on else None  # the next step, before this one is read
        got = loop.read(cur)
        now = time.perf_counter()
        if self._dev_read_at is not None and loop.guarded:
            loop.timed(now - self._dev_read_at)  # pipelined: one step's time between two reads
        self._dev_read_at = now if go_on else None
        self.tokens.extend([self.root, *got.tokens[:-1]])
        self.cache.advance(got.accepted + 1)
        self.root = got.tokens[-1]
        if self._dev_cur is None:
            loop.stop(len(self.tokens))
        self.stats.verify_s += time.perf_counter() - t0  # one graph: drafting is inside it
        self.stats.record(got.depth, got.accepted, got.drafted)
        return got.tokens

    def _plain_step(self, draft_s: float = 0.0) -> list[int]:
        """One token through the plain decode path (the decode graph on a GPU). Also the step for a
        root-only tree (budget 0: nothing drafted), which is cheaper than a one-node verify plus its
        commit and exact: that verify would sample the same distribution at the same node. A drafter
        still gets the root's hidden states (so that it can draft again at the next step)."""
        t0 = time.perf_counter()
        if self._pipelined():
            return self._plain_step_ahead(t0, draft_s)
        ids = torch.tensor([self.root], dtype=torch.long)  # on the host: a graph runner copies it in with the step's other ints
        out = self.runner.forward(StepInput.plain(ids, self.cache.seq_len), capture_layers=self.capture)
        self.tokens.append(self.root)
        if self.drafter is not None:
            # a copy: on a GPU `captured` is the decode graph's output buffer, which the next replay overwrites
            self.drafter.observe([self.root], None if out.captured is None else out.captured.clone())
        self.root = int(self._pick(out)[0])
        self._logprobs(out.logits, [self.root])
        self._advance([self.root])
        self.stats.draft_s += draft_s
        self.stats.verify_s += time.perf_counter() - t0
        self.stats.record(0, 0, 0)
        return [self.root]

    def _pipelined(self) -> bool:
        """Greedy plain decoding through a graph runner: step k + 1 is enqueued before step k's token
        is read back (`enqueue_greedy`), so the GPU does not wait for the host between tokens."""
        enqueue = getattr(self.runner, "enqueue_greedy", None)
        return (enqueue is not None and self.drafter is None and self.params.greedy
                and self.want_logprobs is None and self.constraint is None and getattr(self.runner, "decode", None) is not None)

    def _plain_step_ahead(self, t0: float, draft_s: float) -> list[int]:
        cur, self._ahead = self._ahead, None
        if cur is None:
            cur = self.runner.enqueue_greedy(self.root)
        if self.cache.seq_len < self.cache.max_len:  # the next step, fed by this one's token on the device
            self._ahead = self.runner.enqueue_greedy(None)
        self.tokens.append(self.root)
        self.root = cur.token()
        self.stats.draft_s += draft_s
        self.stats.verify_s += time.perf_counter() - t0
        self.stats.record(0, 0, 0)
        return [self.root]

    def _pick(self, out) -> torch.Tensor:
        """The next token(s) from a step's logits; greedy takes the argmax the CUDA graph computed
        (unless a constraint masks the logits)."""
        if self.params.greedy and out.argmax is not None and not self._constrained:
            return out.argmax
        return pick(self._masked(out.logits), self.params, self.generator)

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [1, vocab] at the committed output, constrained (past an end token: as they are, the
        output ended; so NodeMasks has it)."""
        return masked(logits, self.constraint.allowed()) if self._constrained else logits

    @property
    def _constrained(self) -> bool:
        """A constraint applies: the request has one and its output has not ended (what follows an end
        token is cut by the engine; the decoder then runs as unconstrained, so spec and plain still agree)."""
        return self.constraint is not None and not self._ended

    def _advance(self, tokens: list[int]) -> None:
        """Move the constraint over emitted tokens, up to the first end token (the output ends there)."""
        if self.constraint is None:
            return
        for t in tokens:
            if self._ended or t in self.end_ids:
                self._ended = True
                return
            self.constraint.advance(t)

    def _logprobs(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """logits [n, vocab] at the nodes that produced `tokens` -> (token, logprob, top-k) per token."""
        if self.want_logprobs is None:
            return
        lp = torch.log_softmax(logits.float(), dim=-1)
        chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
        k = self.want_logprobs
        tops = [[] for _ in tokens]
        if k:
            vals, idx = lp.topk(k, dim=-1)
            tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
        self.last_logprobs = list(zip(tokens, chosen, tops))


def _rows(captured: torch.Tensor | None, path: list[int]) -> torch.Tensor | None:
    """The captured hidden states of the committed nodes. A path that is a prefix of the node
    order (the top-1 chain of a seeded DDTree, any accepted chain) is a view: no index tensor to
    upload, no gather launch. On a GPU the view is the verify graph's output buffer; the drafter
    consumes it in its next `propose`, which comes before the next target pass."""
    if captured is None:
        return None
    if path[-1] == len(path) - 1:  # increasing from 0: exactly 0, 1, ..., k
        return captured[: len(path)]
    return captured[torch.tensor(path, device=captured.device)]


def _fit(tree: DraftTree, room: int) -> DraftTree:
    """Keep the first `room` nodes (parents precede children, so any prefix is a tree)."""
    if tree.num_nodes <= room:
        return tree
    if room < 1:
        raise RuntimeError("the context is full")
    probs = tree.child_probs[:room] if tree.child_probs is not None else None
    return DraftTree(tree.token_ids[:room], tree.parents[:room], probs)
