"""The request's sampler: temperature, top-k, top-p, min-p and a seed, as pure functions.

Verification applies the same processing to the target's logits, so every committed token is
a sample from exactly the distribution plain decoding would have drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from treeflash.errors import InvalidRequestError


TREE_SAMPLING = ("rejection", "match")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    # sampled DDTrees (spec/verify.py): "rejection" draws each node's children from the drafter's q
    # without replacement and verifies by recursive rejection; "match" keeps the deterministic top-k
    # children and sample-and-match. Both are exact; the device path (device_step.py) always matches.
    tree_sampling: str = "match"  # "rejection" is exact (tests/spec/test_sampled.py); default once its tau is measured on real weights

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}", "temperature")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}", "top_k")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if self.tree_sampling not in TREE_SAMPLING:
            raise InvalidRequestError(f"tree_sampling must be one of {', '.join(TREE_SAMPLING)}, got {self.tree_sampling!r}", "tree_sampling")

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


# -- the same, inside a CUDA graph (spec/device_step.py): parameters and randomness in device memory --

OFF_TOP_P = 2.0  # a top_p no mass prefix reaches: nothing dropped, as top_p = 1.0 on the host


def needs_order(params: SamplingParams) -> bool:
    """Whether the processed distribution depends on the tokens' order (top-k or top-p on): the device
    steps then sort (processed_probs_static); without, kernels/spec/sample.py draws with no sort."""
    return 0 < params.top_k or params.top_p < 1.0


def static_params(params: SamplingParams, vocab: int) -> tuple[list[float], int]:
    """(temperature, top_p, min_p), top_k for processed_probs_static: every filter always runs, a
    neutral value where the request has it off."""
    top_k = params.top_k if 0 < params.top_k < vocab else vocab
    top_p = params.top_p if params.top_p < 1.0 else OFF_TOP_P
    return [params.temperature, top_p, params.min_p], top_k


def processed_probs_static(
    logits: torch.Tensor,  # [N, vocab]
    fparams: torch.Tensor,  # [3] fp32: temperature (> 0), top_p (OFF_TOP_P = off), min_p (0 = off)
    top_k: torch.Tensor,  # [1] long: kept candidates (vocab = off)
) -> torch.Tensor:  # [N, vocab] fp32, rows sum to 1
    """target_probs for a sampled request with no host branch on the parameters' values (one CUDA
    graph serves every request): the same filters in the same order."""
    logits = logits.float() / fparams[0]
    sorted_l, order = logits.sort(dim=-1, descending=True)
    kth = sorted_l.gather(-1, (top_k - 1).expand(logits.shape[0], 1))
    logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_p = probs.gather(-1, order)  # descending: softmax keeps the logits' order
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= fparams[1])
    probs = probs.masked_fill(drop, 0.0)
    probs = probs.masked_fill(probs < fparams[2] * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)
