"""The request's sampler: temperature, top-k, top-p, min-p and a seed, as pure functions.

Verification applies the same processing to the target's logits, so every committed token is
a sample from exactly the distribution plain decoding would have drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}", "temperature")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}", "top_k")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [N, vocab] -> the sampling distribution [N, vocab] fp32 (one-hot argmax when greedy)."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
        drop_sorted = before >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [N, vocab] -> tokens [N] long. Greedy (one-hot) rows give their argmax without drawing."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits [N, vocab] -> tokens [N]: argmax when greedy, else a sample of the processed distribution."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(target_probs(logits, params), generator)
