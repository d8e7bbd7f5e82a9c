"""`dflash` drafter: one DFlash pass drafts every depth of a block; DDTree turns it into a tree.

Per step: embed the block [root, MASK x (B-1)] at positions len(tokens) .. len(tokens)+B-1 with the
target's embedding, run the DFlash layers over it and the context rows committed since the last
step (their target hidden states arrive through `observe`), and read B - 1 distributions (depths
1 .. B-1) through the target's head. Then:

- tree (default): DDTree best-first over the per-depth log-probabilities, `budget` nodes (with
  seed_chain, Lucebox's variant, the top-1 chain first: it accepted less, bench/ddtree_policy_sim.py).
  Sampled requests draw each node's children from the drafter's processed distribution without
  replacement (ddtree.sample_tree) and are verified by recursive rejection (verify.py), or, with
  tree_sampling="match", keep the top-k children and sample-and-match; both are lossless.
- chain (`tree=False`): the top-1 token per depth (greedy), or one sample per depth from the
  request's processed distribution q, attached as `child_probs` so that verification uses
  rejection sampling. DFlash samples each depth independently of the tokens above it, so q is
  exactly the conditional distribution the token was drawn from, as rejection sampling requires.

`budget="auto"` hands the budget to an AutoBudget (budget.py): per request a bandit over budgets
(bandit.py), fed with the accepted path of every tree this drafter proposed and with its plain steps.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from treeflash.errors import ModelLoadError
from treeflash.models.default_model import default_drafter_path, is_default_model
from treeflash.models.transformer import CausalLM
from treeflash.spec.bandit import BanditConfig
from treeflash.spec.budget import AutoBudget, measure_verify_times, runner_verify_timer
from treeflash.spec.ddtree import build_tree, sample_tree, tree_from_top
from treeflash.spec.device_loop import DeviceLoop
from treeflash.spec.device_step import DeviceStep, supported
from treeflash.spec.dflash_model import DFlashModel, load_dflash
from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.sampling import SamplingParams, needs_order, sample, target_probs
from treeflash.spec.tree import DraftTree

AUTO_MAX_BUDGET = 64


class DFlashDrafter(Drafter):
    name = "dflash"

    # seed_chain off by default: plain best-first accepted more than the top-1-chain seed at every budget, offline on the
    # default model's 20 held-out prompts (bench/ddtree_policy_sim.py, bench/results/s24/ddtree_policy_sim_cpu.json: tau along
    # the decode walk +1.4% at budget 48, +3.9% at 32, +20% at 16; fp32 on the CPU)
    def __init__(self, target: CausalLM, model: DFlashModel, budget: int | str = "auto", tree: bool = True, seed_chain: bool = False,
                 bandit: BanditConfig = BanditConfig()):
        c = model.config
        _check_pair(target, model)
        self.target, self.model, self.tree, self.seed_chain = target, model.fuse(), tree, seed_chain  # fewer GEMMs a layer
        self.capture_layers = tuple(c.target_layer_ids)
        self.max_depth = c.block_size - 1
        # HF's hidden_states[-1] (what the reference trains on) is after the target's final norm
        self.normed_slot = c.target_layer_ids.index(target.config.num_layers - 1) if target.config.num_layers - 1 in c.target_layer_ids else None
        limit = AUTO_MAX_BUDGET if tree else self.max_depth
        self.tuner: AutoBudget | None = None
        if budget == "auto":
            self.tuner = AutoBudget(limit, lambda n: measure_verify_times(target, n), bandit)
            self.fixed_budget = None
        else:
            self.fixed_budget = min(int(budget), limit) if not tree else int(budget)
        self.cache = model.new_cache()
        self.graphs = None  # DraftGraphs once bound to a static-shape runner
        # DeviceSteps by kind: "device_step" (greedy, captured at bind_runner), "device_step_sampled" (at the
        # first sampled request), "device_step_filtered" (the same with top-k / top-p)
        self.loops: dict[str, DeviceStep] = {}
        self.device_step_failed: set[str] = set()  # device-step kinds whose build failed: not retried
        self.reset()

    def bind_runner(self, runner) -> None:
        """Time verify passes through the decoder's own runner (graphs on a GPU) for --budget auto,
        and, beside a static-shape runner, draft through static passes too (CUDA graphs on a GPU)."""
        if self.tuner is not None:
            timer = runner_verify_timer(runner)

            def measure(context_len: int):
                self.own_pending()  # the timed verify passes overwrite the buffer the observed rows may view
                return timer(context_len)

            self.tuner.measure = measure
        if getattr(runner, "max_len", None) is not None and hasattr(runner, "use_graphs"):
            try:
                self.static_passes(runner.max_len, runner.use_graphs)
            except (RuntimeError, torch.OutOfMemoryError) as e:  # slower, still exact: say so and go on eagerly
                warnings.warn(f"dflash: capturing the drafter's CUDA graphs failed ({e}); drafting eagerly")
                self.graphs = None
                self.reset()
        self.loops = {}
        self.device_step_failed = set()
        if self.graphs is not None:
            self._build_device_step(runner)

    @torch.inference_mode()  # as the runner's own captures: weights that require grad must not reach autograd
    def _build_device_step(self, runner) -> None:
        """Greedy requests' steps as one graph each (device_step.py), captured here, before any request
        (its warm-ups write scratch rows; a first request would otherwise pay the capture in its
        time to first token). Decoders that cannot use it keep the synchronous step."""
        t = supported(runner, self, None)
        if not t:
            return
        try:
            self.loops["device_step"] = DeviceStep(runner, self, t)
        except Exception as e:  # a capture or a kernel compile (triton raises its own types): exact either way
            warnings.warn(f"dflash: capturing the device step failed ({type(e).__name__}: {e}); greedy steps stay synchronous")
            self.device_step_failed = {"device_step"}  # not retried per request
        runner.cache.reset()
        self.reset()

    def static_passes(self, max_len: int, use_graphs: bool | None = None) -> None:
        """Capture the drafting pass per new-row count (draft context up to `max_len` rows); resets the drafter."""
        from treeflash.spec.dflash_graph import DraftGraphs

        top_k = (AUTO_MAX_BUDGET if self.tuner is not None else max(self.fixed_budget or 1, 1)) if self.tree else 1
        self.graphs = DraftGraphs(self.model, self.target, self.cache, max_len + self.model.config.block_size,
                                  top_k, self._prepare, use_graphs)
        self.reset()

    # -- the drafter protocol --

    def reset(self) -> None:
        """A new sequence: with --budget auto, a new request's bandit (the last one's evidence folds into its prior)."""
        if self.tuner is not None:
            self.tuner.start_request()
        self._prompted = False  # the first observe after a reset is the prompt's, not a step's
        self._proposed = False  # the first propose after a reset also projects the prompt's rows
        self.cache.reset()
        self._pending: list[torch.Tensor] = []  # [n, C] context rows observed, not yet projected
        self._observed = 0  # tokens whose hidden states arrived (= the draft context length)
        self._last: tuple[DraftTree, float] | None = None  # the last proposed tree and its draft time

    def observe(self, committed_ids: list[int], hidden: torch.Tensor | None) -> None:
        if hidden is None or hidden.shape[0] != len(committed_ids):
            raise RuntimeError("dflash needs the target's hidden states at every committed token (capture_layers)")
        self._pending.append(hidden)  # raw: `_prepare` normalizes the final-norm slot at draft time
        self._observed += len(committed_ids)
        self._absorb_excess()
        if self._last is not None and self.tuner is not None:
            tree, draft_s = self._last
            self.tuner.record(tree.budget, _accepted_nodes(tree, committed_ids), draft_s if self._proposed else None)
            self._proposed = True
        elif self.tuner is not None and self._prompted:  # a plain step (budget 0)
            self.tuner.record_plain()
        self._prompted = True
        self._last = None

    def observe_prompt(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> None:
        """One prefill chunk's rows: beside static passes they go into the draft cache now (all but the
        last), so a prefill holds one chunk's features, never the whole prompt's (at 128K context the
        27B shape's five captured layers are 6.7 GB). Not a step: the budget tuner records nothing."""
        if hidden is None or hidden.shape[0] != len(prompt_ids):
            raise RuntimeError("dflash needs the target's hidden states at every prompt token (capture_layers)")
        self._pending.append(hidden)
        self._observed += len(prompt_ids)
        self._absorb_excess()
        self._prompted = True

    def _absorb_excess(self) -> None:
        """Beside static passes, rows past what one pass takes (a prompt, rows piled up over plain
        steps) go into the draft cache now, all but the last: the next pass, a graph, drafts from
        one new row, and the device loop (device_step.py) can start at the first step after a prompt.
        Eagerly, a few launches a layer, in the prefill's time rather than a step's."""
        n = sum(r.shape[0] for r in self._pending)
        if self.graphs is None or n <= self.graphs.block_size:
            return
        rows = torch.cat(self._pending)
        self._pending = [rows[-1:].clone()]  # a copy: the rows may view a target output buffer
        self.model.absorb(self._prepare(rows[:-1].to(self.model.dtype)), self.cache)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        if self._observed != len(ctx.tokens):
            raise RuntimeError(f"dflash: observed {self._observed} tokens, the context has {len(ctx.tokens)}")
        budget = min(self._budget(len(ctx.tokens), ctx.max_nodes - 1), ctx.max_nodes - 1)
        if budget < 1:
            return DraftTree.root_only(ctx.root, self.target.device)
        t0 = time.perf_counter()
        static = self._static_pass(ctx.root)
        if static is not None and ctx.params.greedy and (not self.tree or budget <= self.graphs.top_k):
            tree = self._from_packed(static.packed, ctx.root, budget)  # one read-back, no vocab-wide work
        else:
            logits = static.logits if static is not None else self.draft_logits(ctx.root)  # [B-1, vocab] fp32
            if self.tree:
                if ctx.params.greedy or ctx.params.tree_sampling == "match":
                    tree = build_tree(self._tree_logprobs(logits, ctx), ctx.root, budget, self.seed_chain)
                else:  # recursive rejection (verify.py) needs children drawn from q
                    tree = sample_tree(target_probs(logits, ctx.params), ctx.root, budget, ctx.generator, self.seed_chain)
            else:
                tree = self._chain(logits[:budget], ctx)
        self._last = (tree, time.perf_counter() - t0)
        return tree

    def describe(self) -> dict[str, Any]:
        c = self.model.config
        out: dict[str, Any] = {
            "name": self.name,
            "block_size": c.block_size,
            "draft_layers": c.num_layers,
            "target_layer_ids": list(c.target_layer_ids),
            "tree": self.tree,
            "seed_chain": self.seed_chain,
        }
        if self.tuner is None:
            out.update(budget=self.fixed_budget, budget_mode="fixed")
        else:
            out.update(budget=self.tuner.budget, budget_mode="auto", budget_reason=self.tuner.reason)
        step = self.device_step
        if step is not None:  # greedy requests on a graph runner draft this many nodes on the device (device_step.py)
            out["device_step_budget"] = step.t - 1
        return out

    # -- the device loop (spec/device_loop.py; DFlash's is spec/device_step.py) --

    def device_loop(self, runner, params: SamplingParams, want_logprobs: int | None) -> DeviceLoop | None:
        """This request's DeviceStep beside `runner` (built once per kind and kept: greedy at bind_runner,
        sampled and filtered at their first request), or None where it cannot run (the synchronous
        steps are exact either way)."""
        t = supported(runner, self, want_logprobs)
        if not t:
            return None
        sampled = not params.greedy
        filtered = sampled and needs_order(params)  # top-k / top-p: a sort per node, in a graph of its own
        name = "device_step_filtered" if filtered else "device_step_sampled" if sampled else "device_step"
        if name in self.device_step_failed:
            return None
        loop = self.loops.get(name)
        if loop is None or loop.runner is not runner or loop.t != t or loop.tree != self.tree:
            try:
                loop = DeviceStep(runner, self, t, sampled=sampled, filtered=filtered)
            except Exception as e:  # a capture or a kernel compile: the synchronous steps are exact
                warnings.warn(f"{name}: building the device step failed ({type(e).__name__}: {e}); synchronous steps")
                self.device_step_failed.add(name)
                return None  # (prefill resets the caches the failed capture's warm-ups wrote)
            self.loops[name] = loop
        return loop

    @property
    def device_step(self) -> DeviceStep | None:
        """The greedy requests' DeviceStep, once bound to a graph runner."""
        return self.loops.get("device_step")

    def pending_rows(self) -> int:
        """Observed rows not drafted from yet (a device loop starts when they fit one pass)."""
        return sum(r.shape[0] for r in self._pending)

    def own_pending(self) -> None:
        """Copy the observed rows that are views of a target output buffer (Drafter.observe), before
        something (a timing pass) overwrites that buffer."""
        self._pending = [r.clone() if r._base is not None else r for r in self._pending]

    def hand_over(self) -> tuple[list[torch.Tensor], int]:
        """-> (the observed rows not drafted from yet, the draft cache length). From here the device
        loop keeps both on the device until `take_back`."""
        rows, self._pending = self._pending, []
        self._last = None
        return rows, self.cache.length

    def take_back(self, rows: torch.Tensor, length: int, observed: int) -> None:
        """The state the device loop ends with: pending rows [n, C] (a copy), draft cache length,
        tokens observed."""
        self._pending, self.cache.length, self._observed, self._last = [rows], length, observed, None

    # -- the parts --

    @torch.inference_mode()
    def draft_logits(self, root: int) -> torch.Tensor:
        """One DFlash pass over the new context rows and the block -> [B-1, vocab] fp32 (depths 1 .. B-1)."""
        c = self.model.config
        dev = self.target.device
        block_ids = torch.full((c.block_size,), c.mask_token_id, dtype=torch.long, device=dev)
        block_ids[0] = root
        block = self.target.embed(block_ids)
        if c.input_embedding_scale != 1.0:
            block = block * c.input_embedding_scale
        context = torch.cat(self._pending) if self._pending else block.new_zeros(0, len(c.target_layer_ids) * c.hidden_size)
        self._pending = []
        hidden = self.model(self._prepare(context.to(block.dtype)), block, self.cache)
        return self.model.logits(hidden[1:], self.target.head).float()

    def _static_pass(self, root: int):
        """The pass through DraftGraphs when bound and the new rows fit one; else None (eager)."""
        n = sum(r.shape[0] for r in self._pending)
        if self.graphs is None or not self.graphs.fits(n):
            return None
        rows, self._pending = self._pending, []
        return self.graphs.run(rows, root)

    def _from_packed(self, packed: torch.Tensor, root: int, budget: int) -> DraftTree:
        """Greedy drafts from a static pass's read-back ([2D, K]: top-K log-probs per depth, then their
        ids); the tree lives on the host, where the runner reads it."""
        packed = packed.cpu()
        d = packed.shape[0] // 2
        if not self.tree:
            return DraftTree.chain(root, packed[d : d + budget, 0].long().tolist())
        top_lp, top_ids = packed[:d, :budget].tolist(), packed[d:, :budget].long().tolist()
        return tree_from_top(top_lp, top_ids, root, budget, self.seed_chain)

    def _prepare(self, context: torch.Tensor) -> torch.Tensor:
        """[n, C] raw target hidden states -> the drafter's input: HF's hidden_states[-1] (what the
        reference trains on) is after the target's final norm, so that slot is normalized."""
        if self.normed_slot is None:
            return context
        h = self.target.config.hidden_size
        s = self.normed_slot * h
        return torch.cat((context[:, :s], self.target.model.norm(context[:, s : s + h]), context[:, s + h :]), dim=1)

    def _budget(self, context_len: int, limit: int) -> int:
        if self.tuner is None:
            assert self.fixed_budget is not None
            return self.fixed_budget
        return self.tuner.next_budget(context_len, limit)

    def _tree_logprobs(self, logits: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """[D, vocab]: the drafter's guess of each depth's target token, under the request's sampler."""
        if ctx.params.greedy:
            return torch.log_softmax(logits, dim=-1)
        return target_probs(logits, ctx.params).log()  # tokens the sampler cannot draw get -inf: never drafted

    def _chain(self, logits: torch.Tensor, ctx: DraftContext) -> DraftTree:
        if ctx.params.greedy:
            return DraftTree.chain(ctx.root, logits.argmax(-1).tolist(), self.target.device)
        q = target_probs(logits, ctx.params)  # [k, vocab]: the distributions the drafts are drawn from
        drafts = sample(q, ctx.generator)
        # row i = the distribution node i's child was drawn from; the last node has no drawn child
        child_probs = torch.cat((q, q.new_zeros(1, q.shape[1])))
        return DraftTree.chain(ctx.root, drafts.tolist(), self.target.device, child_probs)


def _accepted_nodes(tree: DraftTree, committed_ids: list[int]) -> list[int]:
    """The tree nodes that `committed_ids` ([root, accepted...]) walked through, root excluded."""
    kids = tree.children()
    ids = tree.token_ids.tolist()
    node, path = 0, []
    for tok in committed_ids[1:]:
        node = next((c for c in kids[node] if ids[c] == tok), -1)
        if node < 0:
            break
        path.append(node)
    return path


def _check_pair(target: CausalLM, model: DFlashModel) -> None:
    c, t = model.config, target.config
    if c.hidden_size != t.hidden_size:
        raise ModelLoadError(f"dflash drafter hidden_size {c.hidden_size} != the target's {t.hidden_size}: it was trained for another target")
    bad = [i for i in c.target_layer_ids if not 0 <= i < t.num_layers]
    if bad:
        raise ModelLoadError(f"dflash drafter reads target layers {bad}, the target has {t.num_layers}: it was trained for another target")
    if not 0 <= c.mask_token_id < t.vocab_size:
        raise ModelLoadError(f"dflash mask_token_id {c.mask_token_id} is outside the target's vocabulary ({t.vocab_size})")


@register("dflash")
def _build(target, options: DraftOptions) -> Drafter:
    path = options.draft_model
    if not path:
        path = default_drafter_path() if is_default_model(getattr(target, "source", None)) else None
        if path is None:
            raise ModelLoadError("--draft dflash needs --draft-model: a DFlash checkpoint directory (config.json + *.safetensors); "
                                 "only the embedded default model comes with a drafter")
    model = load_dflash(path, target.model.device, target.model.dtype, weights=options.drafter_weights)
    return DFlashDrafter(target.model, model, options.budget, options.tree, bandit=options.bandit)
