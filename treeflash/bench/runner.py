"""Measured runs: every target (an in-process engine or an HTTP endpoint) on every prompt, several passes.

Vocabulary: a *target* is one configuration being measured (the autoregressive baseline, the
drafter at one sweep value, a remote server); a *run* is one request of one target on one
prompt; a *pass* is one round over all prompts (`--runs` passes). Targets are interleaved
prompt by prompt, in alternating order (ABBA), so slow drift of a shared machine (thermal,
other tenants) lands on all targets alike and the ratios between them stay honest.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Protocol

from treeflash.data.prompts import BenchPrompt, encode_prompt


@dataclass(frozen=True)
class BenchSettings:
    max_tokens: int = 2000
    temperature: float = 0.0
    seed: int = 0  # sampled runs are reproducible; ignored at temperature 0
    ignore_eos: bool = False
    runs: int = 3  # passes over the prompt set
    warmup: int = 1  # unrecorded short requests per target before measuring


@dataclass
class RunRecord:
    """One request. Times are seconds from sending the request; decode excludes the first token."""

    target: str  # the target's label
    prompt: str  # the prompt's name
    prompt_index: int
    run: int  # pass index, 0-based
    prompt_tokens: int
    completion_tokens: int
    seconds: float  # request to last token
    first_token_s: float  # request to first token (prefill + one sample)
    finish_reason: str | None
    spec: dict | None = None  # SpecStats.as_dict() plus exact per-depth counts, when a drafter ran
    token_ids: list[int] | None = field(default=None, repr=False)  # kept in memory for the identity check
    extra: dict = field(default_factory=dict)  # endpoint: raw usage, server timings, notes

    @property
    def decode_s(self) -> float:
        return max(self.seconds - self.first_token_s, 1e-9)

    @property
    def decode_tps(self) -> float:
        """Tokens/s after the first token: what speculation speeds up."""
        return max(self.completion_tokens - 1, 0) / self.decode_s

    @property
    def e2e_tps(self) -> float:
        return self.completion_tokens / max(self.seconds, 1e-9)

    def as_dict(self) -> dict:
        d = {
            "target": self.target, "prompt": self.prompt, "prompt_index": self.prompt_index, "run": self.run,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "seconds": round(self.seconds, 5), "first_token_s": round(self.first_token_s, 5),
            "decode_tokens_per_second": round(self.decode_tps, 3), "e2e_tokens_per_second": round(self.e2e_tps, 3),
            "finish_reason": self.finish_reason, "spec": self.spec,
        }
        if self.token_ids is not None:
            d["output_sha1"] = hashlib.sha1(repr(self.token_ids).encode()).hexdigest()[:16]
        if self.extra:
            d["extra"] = self.extra
        return d


class Target(Protocol):
    label: str

    def run(self, prompt: BenchPrompt, settings: BenchSettings, max_tokens: int) -> RunRecord: ...

    def describe(self) -> dict: ...


class EngineTarget:
    """An in-process Engine. Several can share one LoadedModel (each owns its KV cache)."""

    def __init__(self, engine, label: str, sweep_value=None):
        self.engine, self.label, self.sweep_value = engine, label, sweep_value
        self._ids: dict[str, list[int]] = {}

    def prompt_ids(self, prompt: BenchPrompt) -> list[int]:
        if prompt.name not in self._ids:
            self._ids[prompt.name] = encode_prompt(self.engine.loaded, prompt)
        return self._ids[prompt.name]

    def run(self, prompt: BenchPrompt, settings: BenchSettings, max_tokens: int) -> RunRecord:
        from treeflash.engine.request import GenerationRequest
        from treeflash.spec.sampling import SamplingParams

        req = GenerationRequest(
            prompt_ids=tuple(self.prompt_ids(prompt)),
            sampling=SamplingParams(temperature=settings.temperature, seed=settings.seed),
            max_tokens=max_tokens,
            ignore_eos=settings.ignore_eos,
        )
        before = _counts(self.engine)
        cpu0 = time.process_time()
        cpu_first = None
        ids, last = [], None
        for ev in self.engine.stream(req):
            cpu_first = time.process_time() if cpu_first is None else cpu_first
            ids.extend(ev.token_ids)
            last = ev
        cpu_end = time.process_time()
        u = last.usage
        spec = dict(u.spec) if u.spec else None
        if spec is not None and before is not None:
            after = _counts(self.engine)
            spec["proposed_per_depth"] = _diff(after[0], before[0])
            spec["accepted_per_depth"] = _diff(after[1], before[1])
        # CPU seconds of this process (all its threads): on a shared machine, wall time also counts other tenants
        cpu = {"cpu_s": round(cpu_end - cpu0, 4), "decode_cpu_s": round(cpu_end - cpu_first, 4)}
        return RunRecord(self.label, prompt.name, -1, -1, u.prompt_tokens, u.completion_tokens, u.seconds,
                         u.first_token_s, last.finish_reason, spec, ids, cpu)

    def describe(self) -> dict:
        e = self.engine
        d = {"label": self.label, "kind": "in-process", "draft": e.config.draft, "max_context": e.max_context,
             "cache_type_k": e.config.cache_type_k, "cache_type_v": e.config.cache_type_v,
             "cache_k_exact_layers": e.config.cache_k_exact_layers}
        if e.drafter is not None:
            d["drafter"] = e.drafter.describe()
        if self.sweep_value is not None:
            d["sweep_value"] = self.sweep_value
        return d


def run_schedule(targets: list[Target], prompts: list[BenchPrompt], settings: BenchSettings,
                 progress: bool = True) -> list[RunRecord]:
    """Warm every target up, then `runs` passes; within a pass, prompt by prompt, all targets (ABBA order)."""
    from tqdm import tqdm

    for t in targets:
        for _ in range(settings.warmup):
            t.run(prompts[0], settings, min(16, settings.max_tokens))
    records: list[RunRecord] = []
    total = settings.runs * len(prompts) * len(targets)
    with tqdm(total=total, desc="bench", unit="req", disable=not progress, dynamic_ncols=True) as bar:
        step = 0
        for r in range(settings.runs):
            for i, prompt in enumerate(prompts):
                order = targets if step % 2 == 0 else targets[::-1]
                step += 1
                for t in order:
                    rec = t.run(prompt, settings, settings.max_tokens)
                    rec.prompt_index, rec.run = i, r
                    records.append(rec)
                    post = {"target": t.label, "tok/s": f"{rec.decode_tps:.1f}"}
                    if rec.spec:
                        post["tau"] = f"{rec.spec['tau']:.2f}"
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
    return records


def _counts(engine) -> tuple[list[int], list[int]] | None:
    totals = getattr(engine, "totals", None)
    if totals is None:
        return None
    return list(totals.proposed_per_depth), list(totals.accepted_per_depth)


def _diff(after: list[int], before: list[int]) -> list[int]:
    return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)]
