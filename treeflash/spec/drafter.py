"""The one drafter protocol and its registry.

A drafter sees the committed tokens and the root, and returns a DraftTree (a chain is a tree of
width one). After each target pass it is told which tokens were committed and, if it asked for
them via `capture_layers`, the target's hidden states at those tokens (DFlash conditions on them).
The engine never branches on a drafter's name outside `build_drafter`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from treeflash.errors import InvalidRequestError
from treeflash.spec.bandit import BanditConfig
from treeflash.spec.sampling import SamplingParams
from treeflash.spec.tree import DraftTree

if TYPE_CHECKING:
    from treeflash.spec.device_loop import DeviceLoop


@dataclass(frozen=True)
class DraftOptions:
    """User-facing drafter options (CLI flags / server settings)."""

    num_draft: int = 5  # chain length for ngram / draft / mtp
    draft_model: str | None = None  # path for `draft` and `dflash`
    budget: int | str = "auto"  # DDTree node budget, or "auto"
    tree: bool = True  # dflash: build a DDTree (False = the plain DFlash chain)
    mtp_tree: bool = False  # mtp: a DDTree from the head's per-depth distributions instead of a chain
    ngram_max: int = 4  # ngram: longest suffix to match
    ngram_min: int = 1
    replay_corrupt: float = 0.0  # replay (an oracle for benchmarks): chance that a drafted token is replaced
    drafter_weights: str = "float"  # dflash: its linear layers at the runtime dtype, or "q8_0" blocks (dflash_model.DRAFTER_WEIGHTS)
    bandit: BanditConfig = BanditConfig()  # budget="auto": the policy's arms, discount and exploration (spec/bandit.py)

    def __post_init__(self) -> None:
        if self.num_draft < 1 or self.num_draft > 64:
            raise InvalidRequestError(f"--num-draft must be in [1, 64], got {self.num_draft}", "num_draft")
        if self.budget != "auto" and (not isinstance(self.budget, int) or not 1 <= self.budget <= 512):
            raise InvalidRequestError(f"--budget must be 'auto' or an integer in [1, 512], got {self.budget!r}", "budget")
        if self.drafter_weights not in ("float", "q8_0"):
            raise InvalidRequestError(f"--drafter-weights must be float or q8_0, got {self.drafter_weights!r}", "drafter_weights")
        if not 0.0 <= self.replay_corrupt <= 1.0:
            raise InvalidRequestError(f"--replay-corrupt must be in [0, 1], got {self.replay_corrupt}", "replay_corrupt")


@dataclass
class DraftContext:
    tokens: list[int]  # committed tokens: prompt + output so far (the root excluded)
    root: int  # the token the target processes next
    params: SamplingParams
    generator: torch.Generator | None
    max_nodes: int  # the tree may hold at most this many nodes, root included


class Drafter(ABC):
    name: str = "drafter"
    capture_layers: tuple[int, ...] = ()  # target layers whose outputs `observe` receives

    def reset(self) -> None:
        """A new sequence starts (the prompt follows through observe)."""

    @abstractmethod
    def propose(self, ctx: DraftContext) -> DraftTree: ...

    def observe(self, committed_ids: list[int], hidden: torch.Tensor | None) -> None:
        """Tokens just committed to the target cache, with captured hidden states [n, C] (or None).

        `hidden` may be a view of the target's output buffer (on a GPU, a CUDA graph's), which the
        next target pass overwrites: a drafter that keeps it past that pass keeps a copy."""

    def observe_prompt(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> None:
        """A part of the prompt, committed by a prefill chunk, with its captured hidden states [n, C]
        (or None). Decoder.prefill calls it once per chunk, in order, after `reset` and before any
        `propose`, so a drafter never needs the whole prompt's rows at once. Default: `observe`."""
        self.observe(prompt_ids, hidden)

    def bind_runner(self, runner: Any) -> None:
        """The engine hands over the target's runner (CUDA graphs on a GPU) once it exists."""

    def device_loop(self, runner: Any, params: SamplingParams, want_logprobs: int | None) -> "DeviceLoop | None":
        """The device fast path for a request (spec/device_loop.py): a DeviceLoop that runs whole drafted
        steps on the device beside `runner`, or None (the default: synchronous steps)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


DrafterFactory = Callable[[Any, DraftOptions], Drafter]  # (loaded target, options) -> drafter
_REGISTRY: dict[str, DrafterFactory] = {}


def register(name: str) -> Callable[[DrafterFactory], DrafterFactory]:
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        _REGISTRY[name] = factory
        return factory

    return wrap


def build_drafter(name: str, target: Any, options: DraftOptions) -> Drafter:
    """target: the loaded target (treeflash.models.loader.LoadedModel)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise InvalidRequestError(f"unknown drafter {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}", "draft")
    return _REGISTRY[name](target, options)


def _load_builtin() -> None:
    import importlib

    for mod in ("ngram", "draft_model", "mtp", "dflash", "replay"):
        try:
            importlib.import_module(f"treeflash.spec.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"treeflash.spec.{mod}":
                raise
