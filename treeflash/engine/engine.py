"""Engine: one loaded target (and optional drafter) turning GenerationRequests into TokenEvents.

Streaming is the primitive: `stream(request)` yields events; `complete(request)` is a fold over
it, so the two can never disagree. One sequence runs at a time (batch 1, the latency-optimal
setting speculative decoding targets); callers serialize through `lock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from treeflash.engine.detokenizer import Detokenizer
from treeflash.engine.grammar import GrammarCompiler
from treeflash.engine.prefix_cache import Hit, PrefixCache, PrefixCacheConfig
from treeflash.engine.request import GenerationRequest, TokenEvent, TokenLogprob, Usage
from treeflash.engine.stops import StopMatcher
from treeflash.errors import ContextOverflowError, InvalidRequestError
from treeflash.spec.constraint import AllOf, Constraint, MinTokens
from treeflash.spec.decoder import Decoder
from treeflash.spec.drafter import Drafter, DraftOptions, build_drafter
from treeflash.spec.stats import SpecStats


@dataclass(frozen=True)
class EngineConfig:
    max_context: int = 8192  # tokens of KV cache allocated (prompt + output + one verify tree)
    draft: str | None = None  # drafter name from the registry, or None for plain decoding
    draft_options: DraftOptions = DraftOptions()
    cache_type_k: str = "auto"
    cache_type_v: str = "auto"
    cache_k_exact_layers: int = 0  # the first N attention layers keep K uncompressed (kv.cache.CacheSpec)
    cuda_graphs: bool = True  # on CUDA: decode and verify replay captured graphs
    device_steps: bool = True  # with CUDA graphs: drafted steps that can run on the device do (False: synchronous)
    prefix_cache: PrefixCacheConfig = PrefixCacheConfig()  # off unless max_mb > 0 (engine/prefix_cache.py)
    graph_buckets: tuple[int, ...] | None = None  # verify sizes captured as graphs (None: the runner's default, up to 128)
    memory_plan: Any = None  # the models.memory MemoryPlan this engine was sized by (reported by /metrics and bench)


class Engine:
    def __init__(self, loaded, config: EngineConfig = EngineConfig()):
        """loaded: treeflash.models.loader.LoadedModel (model, tokenizer, chat_template, config)."""
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = config
        self.max_context = min(config.max_context, loaded.config.max_position_embeddings)
        self.drafter: Drafter | None = build_drafter(config.draft, loaded, config.draft_options) if config.draft else None
        self.cache = self.model.new_cache(self.max_context + 1, config.cache_type_k, config.cache_type_v,
                                          k_exact_layers=config.cache_k_exact_layers)
        self.runner = None  # eager on the CPU; CUDA graphs for decode and verify on a GPU
        if self.model.device.type == "cuda" and config.cuda_graphs:
            from treeflash.engine.stack import build_runner

            self.model.fuse_projections()
            buckets = {"buckets": config.graph_buckets} if config.graph_buckets else {}
            self.runner = build_runner(self.model, self.cache, self.drafter, **buckets)
        self.prefix: PrefixCache | None = None
        self._last_decoder: Decoder | None = None  # the running request's, while its cache rows are committed
        if config.prefix_cache.enabled:
            wants_hidden = self.drafter is not None and bool(self.drafter.capture_layers)
            self.prefix = PrefixCache(self.cache, config.prefix_cache, wants_hidden)
        self.lock = threading.Lock()
        self.totals = SpecStats()
        self.eos_ids = set(loaded.config.eos_token_ids)
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            self.eos_ids.add(int(tok_eos))
        self.grammars = GrammarCompiler(self.tokenizer, self.model.config.vocab_size, sorted(self.eos_ids))  # built on first use

    # -- tokenization helpers shared by the CLI and the server --
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        if prompt_len + max_tokens > self.max_context:
            raise ContextOverflowError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {prompt_len + max_tokens} "
                f"exceeds the context length {self.max_context}",
                "max_tokens",
            )

    def stream(self, req: GenerationRequest, cancelled: threading.Event | None = None) -> Iterator[TokenEvent]:
        """Yields one event per engine step; the last event has finish_reason and usage."""
        self.check_fits(len(req.prompt_ids), req.max_tokens)
        for tok in req.prompt_ids:
            if not 0 <= tok < self.model.config.vocab_size:
                raise InvalidRequestError(f"token id {tok} is out of range [0, {self.model.config.vocab_size})", "prompt")
        with self.lock:
            yield from self._run(req, cancelled)

    def _run(self, req: GenerationRequest, cancelled: threading.Event | None) -> Iterator[TokenEvent]:
        try:
            yield from self._generate(req, cancelled, self.prefix)
        finally:
            # finished, or stopped between two steps (close()): the cache's rows hold dec.tokens, keep
            # them for the next prompt; an error inside a step leaves no such decoder: forget them
            dec, self._last_decoder = self._last_decoder, None
            if self.prefix is not None:
                if dec is not None:
                    self.prefix.record(dec.cached_tokens, len(req.prompt_ids), dec.prompt_hidden)
                else:
                    self.prefix.clear()

    def _generate(self, req: GenerationRequest, cancelled: threading.Event | None, prefix: PrefixCache | None) -> Iterator[TokenEvent]:
        t0 = time.perf_counter()
        gen = req.sampling.generator(self.model.device if self.model.device.type == "cuda" else "cpu")
        end_ids = set(req.stop_token_ids) | (set() if req.ignore_eos else self.eos_ids)
        dec = Decoder(self.model, self.cache, req.sampling, self.drafter, generator=gen, want_logprobs=req.logprobs, runner=self.runner,
                      device_steps=self.config.device_steps, constraint=self.constraint(req, end_ids), end_ids=frozenset(end_ids),
                      keep_prompt_hidden=prefix is not None and prefix.wants_hidden)
        self._last_decoder = None
        detok = Detokenizer(self.tokenizer, req.prompt_ids)
        stops = StopMatcher(req.stop)
        produced = 0
        first_token_s = 0.0
        prompt = list(req.prompt_ids)
        hit = prefix.lookup(prompt) if prefix is not None else Hit(0, None)
        chunk = self.config.prefix_cache.chunk
        new = [dec.prefill(prompt, chunk, start=hit.start, hidden_before=hit.hidden_before,
                           stops=prefix.stops(hit.start, len(prompt)) if prefix is not None else (),
                           on_stop=prefix.snapshot if prefix is not None else None)]
        self._last_decoder = dec
        first_token_s = time.perf_counter() - t0
        lps = dec.last_logprobs
        finish = None
        while True:
            # cut at max_tokens and at the first end token (it is kept in usage, not in the text)
            if produced + len(new) >= req.max_tokens:
                new, finish = new[: req.max_tokens - produced], "length"
            hit_end = next((i for i, t in enumerate(new) if t in end_ids), None)
            shown = new
            if hit_end is not None:
                new, shown, finish = new[: hit_end + 1], new[:hit_end], "stop"
            unarmed = min(len(shown), max(0, req.min_tokens - 1 - produced))  # tokens before min_tokens: no stop string ends there
            produced += len(new)
            text = stops.feed(detok.push(shown[:unarmed]), armed=False)[0] if unarmed else ""
            more, stopped = stops.feed(detok.push(shown[unarmed:]))
            text += more
            if stopped:
                finish = "stop"
            elif finish is not None:
                text += stops.feed(detok.flush())[0] + stops.flush()
            if cancelled is not None and cancelled.is_set() and finish is None:
                finish = "cancelled"
            event = TokenEvent(new, text, finish, _logprob_events(lps, len(new)))
            if finish is not None:
                event.usage = Usage(len(req.prompt_ids), produced, time.perf_counter() - t0, first_token_s,
                                    dec.stats.as_dict() if self.drafter is not None else None, cached_tokens=dec.resumed)
                event.stop_string = stops.matched if stopped else None
                self.totals.merge(dec.stats)
                yield event
                return
            yield event
            self._last_decoder = None  # a step is running: its cache rows are not committed yet
            new = dec.step()
            self._last_decoder = dec
            lps = dec.last_logprobs

    def constraint(self, req: GenerationRequest, end_ids: set[int]) -> Constraint | None:
        """The request's constraint: its grammar, then min_tokens (which yields to a complete grammar)."""
        parts: list[Constraint] = []
        if req.grammar is not None:
            parts.append(self.grammars.constraint(req.grammar))
        if req.min_tokens > 0 and end_ids:
            parts.append(MinTokens(req.min_tokens, end_ids, self.model.config.vocab_size))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else AllOf(parts)

    def complete(self, req: GenerationRequest) -> tuple[str, list[int], TokenEvent]:
        """The non-streaming result, folded from the stream: (text, token_ids, final event)."""
        text, ids, last = [], [], None
        for ev in self.stream(req):
            text.append(ev.text)
            ids.extend(ev.token_ids)
            last = ev
        assert last is not None
        return "".join(text), ids, last


def _logprob_events(lps, n: int) -> list[TokenLogprob] | None:
    if lps is None:
        return None
    return [TokenLogprob(t, lp, top) for t, lp, top in lps[:n]]
