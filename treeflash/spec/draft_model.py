"""`draft` drafter: a second, smaller model with the target's vocabulary proposes a chain.

The draft keeps its own ModelCache and follows the committed tokens:
- attention-only drafts draft with plain steps (root, d1, ..., d_{k-1} are appended to their
  cache); after each verify `observe` truncates the cache to the longest prefix the target
  committed. What the draft has not seen yet (the last accepted draft, the new root) is fed at the
  next `propose`, in the same pass that drafts the first token. A prompt is read in `observe`.
- hybrid drafts (Gated DeltaNet layers: recurrent state cannot rewind) draft with verify steps
  over the chain [unseen..., root, d1, ..., d_i], one pass per drafted token, and leave the last
  pass pending; `observe` then keeps the committed part of that chain with `cache.commit(path)`.

Sampled requests: each draft token is drawn from the draft's distribution processed with the
request's sampler (temperature, top-k, top-p, min-p), and the chain carries those distributions as
`child_probs` (row i = the distribution node i + 1 was drawn from), so the verifier runs
rejection sampling (Leviathan et al. 2023). Greedy requests take the draft's argmax.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from treeflash.errors import InvalidRequestError, ModelLoadError
from treeflash.models.step import StepInput
from treeflash.models.transformer import CausalLM
from treeflash.spec.drafter import DraftContext, Drafter, DraftOptions, register
from treeflash.spec.sampling import SamplingParams, sample, target_probs
from treeflash.spec.tree import DraftTree

PREFILL_CHUNK = 2048  # plain-step chunk when the draft catches up on a long prompt
MAX_CHAIN_CATCH_UP = 16  # hybrid: unseen committed tokens folded into the drafting chain


def draft_token(
    logits: torch.Tensor,  # [vocab_draft] the drafter's logits for the next token
    params: SamplingParams,
    generator: torch.Generator | None,
    target_vocab: int,
) -> tuple[int, torch.Tensor | None]:  # (token, q [target_vocab] fp32 or None when greedy)
    """Pick one draft token: the argmax when greedy, else a sample of the processed distribution q.

    q is what the verifier's rejection test divides by, so it must be exactly the distribution the
    token was drawn from; ids the draft cannot produce (a smaller draft vocabulary) get q = 0."""
    if params.greedy:
        return int(logits.argmax()), None
    q = target_probs(logits[None], params)[0]
    if q.shape[0] < target_vocab:
        q = F.pad(q, (0, target_vocab - q.shape[0]))
    return int(sample(q[None], generator)[0]), q


def chain_tree(root: int, drafts: list[int], qs: list[torch.Tensor], device: torch.device) -> DraftTree:
    """A chain with child_probs [N, vocab] (the last node proposes nothing: its row is zero)."""
    probs = None
    if qs:
        probs = torch.cat((torch.stack(qs), torch.zeros_like(qs[0])[None]))
    return DraftTree.chain(root, drafts, device=device, child_probs=probs)


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of a and b, given that the first `start` items already agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, draft: CausalLM, num_draft: int, target_vocab: int, source: str = "draft model"):
        if draft.config.vocab_size > target_vocab:
            raise ModelLoadError(f"{source}: draft vocabulary ({draft.config.vocab_size}) is larger than the target's ({target_vocab})")
        self.model, self.num_draft, self.target_vocab, self.source = draft, num_draft, target_vocab, source
        self.hybrid = draft.config.is_hybrid
        self.cache = draft.new_cache(1)  # sized at the first propose (the target's cache length)
        self.known: list[int] = []  # committed tokens, as observed
        self.fed: list[int] = []  # tokens whose KV / state is committed in self.cache (len == seq_len)
        self.pending: list[int] = []  # hybrid: tokens of the pending verify chain

    def reset(self) -> None:
        self.cache.reset()
        self.known, self.fed, self.pending = [], [], []

    def observe(self, committed_ids: list[int], hidden: torch.Tensor | None) -> None:
        start = len(self.known)
        self.known.extend(committed_ids)
        if self.pending:  # hybrid: keep the committed part of the drafting chain
            base = len(self.fed)
            keep = common_prefix(self.pending, self.known[base:])
            if keep:
                self.cache.commit(list(range(keep)))
                self.fed.extend(self.pending[:keep])
            else:
                self.cache.truncate(self.cache.seq_len)  # drops the pending step
            self.pending = []
        elif not self.hybrid:  # attention: forget the rejected drafts
            keep = common_prefix(self.fed, self.known, start)
            if keep < len(self.fed):
                self.cache.truncate(keep)
                del self.fed[keep:]
        # a prompt: read it now (prefill time, not the first step's draft time) when the cache,
        # sized by an earlier sequence, has room; a fresh drafter reads it at its first propose
        unseen = len(self.known) - len(self.fed)
        if unseen > MAX_CHAIN_CATCH_UP and len(self.known) + 1 + self.num_draft <= self.cache.max_len:
            with torch.inference_mode():
                self._feed(self.known[len(self.fed) :], want_logits=False)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        k = min(self.num_draft, ctx.max_nodes - 1)
        dev = self.model.device
        if k <= 0:
            return DraftTree.root_only(ctx.root, dev)
        self._sync(ctx)
        if self.hybrid:
            drafts, qs = self._draft_hybrid(ctx, k)
        else:
            drafts, qs = self._draft_plain(ctx, k)
        return chain_tree(ctx.root, drafts, qs, dev)

    def _sync(self, ctx: DraftContext) -> None:
        """Size the cache for the target's context and check that observe saw every committed token."""
        need = len(ctx.tokens) + ctx.max_nodes  # = the target cache's max_len
        if self.pending:
            self.cache.truncate(self.cache.seq_len)
            self.pending = []
        stale = len(self.known) != len(ctx.tokens) or self.known[-1:] != ctx.tokens[-1:]
        if need > self.cache.max_len:
            self.cache = self.model.new_cache(need)
        elif stale:
            self.cache.reset()
        else:
            return
        self.known, self.fed = list(ctx.tokens), []  # re-feed from the committed tokens

    def _draft_plain(self, ctx: DraftContext, k: int) -> tuple[list[int], list[torch.Tensor]]:
        seq = ctx.tokens + [ctx.root]
        new = seq[len(self.fed) :]  # observe kept fed within the committed tokens: the root is new
        logits = self._feed(new)
        drafts, qs = [], []
        for i in range(k):
            tok, q = draft_token(logits, ctx.params, ctx.generator, self.target_vocab)
            drafts.append(tok)
            if q is not None:
                qs.append(q)
            if i + 1 < k:
                logits = self._feed([tok])
        return drafts, qs

    def _draft_hybrid(self, ctx: DraftContext, k: int) -> tuple[list[int], list[torch.Tensor]]:
        unseen = ctx.tokens[len(self.fed) :]
        if len(unseen) > MAX_CHAIN_CATCH_UP:
            self._feed(unseen, want_logits=False)
            unseen = []
        chain = unseen + [ctx.root]
        drafts, qs = [], []
        for i in range(k):
            if i:
                self.cache.truncate(self.cache.seq_len)  # drop the shorter chain of the previous pass
            ids = self._tensor(chain)
            last = torch.tensor([len(chain) - 1], device=ids.device)
            out = self.model(StepInput.chain(ids, self.cache.seq_len), self.cache, logits_at=last)
            tok, q = draft_token(out.logits[0], ctx.params, ctx.generator, self.target_vocab)
            drafts.append(tok)
            if q is not None:
                qs.append(q)
            if i + 1 < k:
                chain.append(tok)
        self.pending = chain  # observe keeps its committed prefix
        return drafts, qs

    def _feed(self, ids: list[int], want_logits: bool = True) -> torch.Tensor | None:
        """Plain steps over ids (committed to the draft cache); the logits after the last one [vocab]."""
        t = self._tensor(ids)
        out = None
        for s in range(0, len(ids), PREFILL_CHUNK):
            part = t[s : s + PREFILL_CHUNK]
            last = s + PREFILL_CHUNK >= len(ids)
            at = torch.tensor([part.shape[0] - 1], device=t.device)
            out = self.model(StepInput.plain(part, self.cache.seq_len), self.cache, logits_at=at, compute_logits=last and want_logits)
        self.fed.extend(ids)
        return out.logits[0] if want_logits else None

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        """Token ids for the draft; ids past a smaller draft vocabulary read as id 0 (only speed suffers)."""
        t = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        return t.masked_fill(t >= self.model.config.vocab_size, 0)

    def describe(self) -> dict[str, Any]:
        c = self.model.config
        return {"name": self.name, "num_draft": self.num_draft, "draft_model": self.source, "draft_arch": c.arch, "draft_layers": c.num_layers}


def check_vocab(target: Any, draft: Any) -> None:
    """Refuse a draft whose token ids do not mean the same as the target's (LoadedModels).

    A smaller draft embedding is fine when every draft token has the same id in the target's
    tokenizer (the draft then never proposes the ids it lacks); anything else is refused."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if dv > tv:
        raise ModelLoadError(f"{draft.source}: the draft's vocabulary ({dv} ids) is larger than the target's ({tv} ids, {target.source}); pick a draft from the target's model family")
    t_tok, d_tok = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if t_tok is None or d_tok is None or not hasattr(t_tok, "get_vocab") or not hasattr(d_tok, "get_vocab"):
        if dv != tv:
            raise ModelLoadError(f"{draft.source}: vocabulary sizes differ ({dv} vs the target's {tv}) and there is no tokenizer to check that the ids agree")
        return
    t_vocab, d_vocab = t_tok.get_vocab(), d_tok.get_vocab()
    bad = [(s, i) for s, i in d_vocab.items() if i < dv and t_vocab.get(s) != i]
    if bad:
        examples = ", ".join(f"{s!r}: draft {i} / target {t_vocab.get(s)}" for s, i in sorted(bad, key=lambda x: x[1])[:3])
        raise ModelLoadError(f"{draft.source}: the draft's tokenizer disagrees with the target's ({target.source}) on {len(bad)} tokens, e.g. {examples}; a draft must share the target's vocabulary")


@register("draft")
def _build(target, options: DraftOptions) -> Drafter:
    if not options.draft_model:
        raise InvalidRequestError("--draft draft needs --draft-model PATH: a smaller model with the target's vocabulary", "draft_model")
    from treeflash.models.loader import load_model

    # a quantized target (--weights native) keeps the draft's GGUF blocks too, through the same loader path
    weights = "native" if getattr(target, "weights", "float") == "native" else "float"
    draft = load_model(options.draft_model, device=target.model.device, dtype=target.model.dtype, progress=False, weights=weights)
    check_vocab(target, draft)
    draft.model.fuse_projections()  # fewer, larger GEMVs: the draft runs num_draft passes per step
    return DraftModelDrafter(draft.model, options.num_draft, target.config.vocab_size, source=draft.source)
