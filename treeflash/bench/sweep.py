"""`--sweep KEY=v1,v2,...`: one engine per value of a drafter option, all over one loaded model.

The best tree budget differs per GPU, so it is picked from measurements: a sweep builds the
Engine objects (each with its own KV cache and drafter) over the same LoadedModel, and the
runner interleaves them with the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from treeflash.errors import InvalidRequestError

SWEEPABLE = ("budget", "num_draft", "ngram_max", "ngram_min")  # integer DraftOptions fields (budget also "auto")


@dataclass(frozen=True)
class Sweep:
    key: str  # a DraftOptions field
    values: tuple[int | str, ...]

    def label(self, draft: str, value: int | str) -> str:
        return f"{draft} {self.key}={value}"


def parse_sweep(text: str) -> Sweep:
    """'budget=6,10,14' -> Sweep('budget', (6, 10, 14)); dashes are accepted for underscores; `budget` also
    takes 'auto' (--budget auto beside fixed budgets: 'budget=auto,8,16,32')."""
    key, sep, rest = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or key not in SWEEPABLE:
        raise InvalidRequestError(f"--sweep must look like KEY=v1,v2,... with KEY one of {', '.join(SWEEPABLE)}; got {text!r}", "sweep")
    try:
        values = tuple(v.strip() if key == "budget" and v.strip() == "auto" else int(v) for v in rest.split(",") if v.strip())
    except ValueError:
        also = " or 'auto'" if key == "budget" else ""
        raise InvalidRequestError(f"--sweep {key}: values must be integers{also}, got {rest!r}", "sweep") from None
    if not values:
        raise InvalidRequestError(f"--sweep {key}: give at least one value", "sweep")
    if len(set(values)) != len(values):
        raise InvalidRequestError(f"--sweep {key}: values repeat: {rest!r}", "sweep")
    return Sweep(key, values)


def engine_configs(base, sweep: Sweep | None) -> list[tuple[str, int | None, object]]:
    """base: the EngineConfig from the command line (with a drafter) -> [(label, sweep value, EngineConfig)]."""
    if base.draft is None:
        raise InvalidRequestError("benchmarking speculation needs --draft (ngram, draft, mtp, dflash); "
                                  "for plain decoding alone leave out --sweep and --baseline", "draft")
    if sweep is None:
        return [(_describe(base), None, base)]
    out = []
    for v in sweep.values:
        options = replace(base.draft_options, **{sweep.key: v})  # validated by DraftOptions
        out.append((sweep.label(base.draft, v), v, replace(base, draft_options=options)))
    return out


def _describe(config) -> str:
    o = config.draft_options
    if config.draft == "dflash":
        return f"dflash budget={o.budget}" + ("" if o.tree else " chain")
    return f"{config.draft} num_draft={o.num_draft}"
