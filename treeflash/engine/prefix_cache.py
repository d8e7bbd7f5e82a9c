"""Prefix cache: a prompt that starts like the last sequence reuses its KV and recurrent state.

Agents resend a growing conversation every turn; without this every turn prefills all of it.
The engine runs one sequence at a time in one ModelCache, and after a request its attention rows
[0, seq_len) still hold the KV of that request's committed tokens (prompt + output). So:

- attention layers: the rows are reused in place, nothing is copied; a new prompt sharing L
  tokens with the cached ones resumes the cache at L (its later rows are overwritten);
- recurrent (Gated DeltaNet) layers cannot rewind, so their (conv window, state) is snapshotted
  at block boundaries while a prompt prefills (every `block` tokens the prefill chunks end at,
  the last boundary before the prompt's end, the prompt's end) and at the end of the output; a
  hit resumes at the longest snapshot inside the shared prefix;
- a drafter that conditions on the target's hidden states (DFlash, MTP: `capture_layers`) gets
  the prompt's captured rows stored too, and is rebuilt from them (drafter.observe over the whole
  prompt, as without the cache), so a hit for it reaches at most the previous prompt's end.

Snapshots and stored rows are bounded by `max_bytes`, oldest used first out (LRU). One sequence
is cached, the last: a request with another prefix replaces it.

Exactness: the resumed rows and states are the ones a fresh prefill computes for those tokens;
only chunk boundaries differ (floating-point order), so at temperature 0 the output is the
uncached output (tests/engine/test_prefix_cache.py) up to near-ties that order flips: on a hybrid
model a snapshot inside a prefill chunk (block < chunk) splits that chunk, and a 4-bit K cache can
turn the difference into another token (seen once with q4_0 on a toy; none with q8_0/tq3_0). A compressed K cache that centres keys on
the first chunk's mean (kv/quantized.py) is resumed only when both prompts share that whole
first chunk, so the centre is the same one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from treeflash.errors import InvalidRequestError
from treeflash.kv.cache import ModelCache


@dataclass(frozen=True)
class PrefixCacheConfig:
    max_mb: float = 0.0  # snapshots + stored hidden rows; 0: no prefix cache
    block: int = 256  # recurrent snapshots every this many prompt tokens (where chunks end)
    chunk: int = 2048  # the prefill chunk (Decoder.prefill's), for the key-centre rule

    def __post_init__(self) -> None:
        if not self.max_mb >= 0:
            raise InvalidRequestError(f"--prefix-cache-mb must be >= 0, got {self.max_mb}", "prefix_cache_mb")
        if self.block < 1 or self.chunk < 1:
            raise InvalidRequestError(f"prefix cache block and chunk must be >= 1, got {self.block} and {self.chunk}", "prefix_cache")

    @property
    def enabled(self) -> bool:
        return self.max_mb > 0


@dataclass(frozen=True)
class Hit:
    start: int  # tokens resumed (0: a miss)
    hidden_before: torch.Tensor | None  # [start, ...] captured rows for the drafter, or None


def _nbytes(snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(c.numel() * c.element_size() + s.numel() * s.element_size() for c, s in snapshot)


class PrefixCache:
    def __init__(self, cache: ModelCache, config: PrefixCacheConfig, wants_hidden: bool):
        self.cache = cache
        self.config = config
        self.wants_hidden = wants_hidden  # the drafter conditions on captured hidden rows
        self.max_bytes = int(config.max_mb * 1024 * 1024)
        self.tokens: list[int] = []  # what the cache's committed rows hold
        self.prompt_len = 0  # of the request that left them
        self.snapshots: OrderedDict[int, list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()  # position -> states
        self.hidden: torch.Tensor | None = None  # [prompt_len, ...] captured rows of that prompt
        self.hits = 0
        self.hit_tokens = 0

    def _centred_keys(self) -> bool:
        return any(getattr(layer, "key_offset", None) is not None for layer in self.cache.layers)

    def lookup(self, prompt: list[int]) -> Hit:
        """Resume the cache for `prompt` as far as it is exact; the Decoder prefills the rest.
        A miss forgets everything (the prefill resets the cache)."""
        shared = 0
        limit = min(len(prompt) - 1, len(self.tokens))  # at least one token is prefilled: its logits start the output
        while shared < limit and prompt[shared] == self.tokens[shared]:
            shared += 1
        if self.wants_hidden:
            shared = min(shared, self.prompt_len if self.hidden is not None else 0)
        if self._centred_keys():
            first = min(self.config.chunk, self.prompt_len)
            if not (shared >= first and len(prompt) >= first and first == min(self.config.chunk, len(prompt))):
                shared = 0
        start, states = shared, None
        if self.cache.has_recurrent:
            start = max((p for p in self.snapshots if p <= shared), default=0)
            states = self.snapshots.get(start)
        if start == 0:
            self.clear()
            return Hit(0, None)
        self.cache.resume(start, states)
        if states is not None:
            self.snapshots.move_to_end(start)
        for p in [p for p in self.snapshots if p > start]:  # their tokens are about to be overwritten
            del self.snapshots[p]
        self.tokens = self.tokens[:start]
        self.hits += 1
        self.hit_tokens += start
        return Hit(start, self.hidden[:start] if self.wants_hidden and self.hidden is not None else None)

    def stops(self, start: int, prompt_len: int) -> tuple[int, ...]:
        """Where the prefill should snapshot recurrent state: block boundaries past `start`, the
        prompt's last boundary, its end. None without recurrent layers (attention rows need none)."""
        if not self.cache.has_recurrent:
            return ()
        b = self.config.block
        return tuple(p for p in range(b, prompt_len + 1, b) if p > start) + ((prompt_len,) if prompt_len % b else ())

    def snapshot(self, position: int) -> None:
        """After the prefill's chunk that ends at `position` (Decoder.prefill's on_stop)."""
        self._put(position, self.cache.recurrent_snapshot())

    def _put(self, position: int, snap: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.snapshots[position] = snap
        self.snapshots.move_to_end(position)
        self._evict()

    def _used(self) -> int:
        hidden = self.hidden.numel() * self.hidden.element_size() if self.hidden is not None else 0
        return hidden + sum(_nbytes(s) for s in self.snapshots.values())

    def _evict(self) -> None:
        while self.snapshots and self._used() > self.max_bytes:
            self.snapshots.popitem(last=False)
        if self.hidden is not None and self._used() > self.max_bytes:
            self.hidden = None

    def record(self, tokens: list[int], prompt_len: int, prompt_hidden: torch.Tensor | None) -> None:
        """After a request: the committed tokens the cache now holds (the output's end snapshotted too)."""
        valid = min(len(tokens), self.cache.seq_len)
        self.tokens = list(tokens[:valid])
        self.prompt_len = min(prompt_len, valid)
        if self.wants_hidden:
            self.hidden = prompt_hidden[: self.prompt_len].clone() if prompt_hidden is not None else None
        if self.cache.has_recurrent and valid == self.cache.seq_len and not self.cache.pending:
            self._put(valid, self.cache.recurrent_snapshot())
        self._evict()

    def clear(self) -> None:
        """Forget the cached sequence (a miss, or a request that ended in an error mid-step)."""
        self.tokens, self.prompt_len, self.hidden = [], 0, None
        self.snapshots.clear()
