"""Aggregation: token-weighted passes, exact acceptance counts, paired speedup, collapse and identity checks."""

from treeflash.bench.runner import RunRecord
from treeflash.bench.summary import collapse_warnings, identical_outputs, summarize


def rec(target, prompt, run, tokens=101, seconds=2.0, ttft=1.0, tau=None, ids=None):
    spec = None
    if tau is not None:
        passes = 50
        spec = {"passes": passes, "committed": int(tau * passes), "tau": tau, "acceptance_per_depth": [0.5],
                "proposed_per_depth": [passes, passes // 2], "accepted_per_depth": [passes // 2, passes // 10],
                "time_s": {"draft": 0.1, "verify": 0.8, "rest": 0.1}}
    return RunRecord(target, prompt, 0, run, 10, tokens, seconds, ttft, "length", spec, ids)


def test_collapse_flags_a_synthetic_drop():
    records = [rec("ngram", "p", 0, tau=3.0), rec("ngram", "p", 1, tau=2.9),  # -3%: noise, not flagged
               rec("ngram", "p", 2, tau=2.0),  # tau -33%
               rec("ngram", "p", 3, seconds=3.0, tau=3.0)]  # 100 tok/s -> 50 tok/s
    w = collapse_warnings(records)
    assert [(x["run"], x["metric"]) for x in w] == [(2, "tau"), (3, "tokens_per_second")]
    assert w[0]["drop"] == round(1 - 2.0 / 3.0, 4) and w[1]["first"] == 100.0


def test_summary_fields_speedup_and_identity():
    records = []
    for run in range(2):
        for p in ("a", "b"):
            records.append(rec("ar", p, run, seconds=2.0, ids=[1, 2, 3]))
            records.append(rec("ngram", p, run, seconds=1.5, tau=2.0, ids=[1, 2, 3] if p == "a" else [1, 9, 3]))
    summary, warnings = summarize(records, ["ar", "ngram"], "ar")
    assert warnings == []
    assert summary["best"] == "ngram" and summary["tau"] == 2.0
    assert summary["tokens_per_second"] == 200.0 and summary["baseline_tokens_per_second"] == 100.0
    assert summary["speedup_vs_baseline"] == 2.0
    ngram = summary["configs"][1]
    assert ngram["acceptance_per_depth"] == [0.5, 0.2]  # exact counts summed over runs
    assert abs(sum(ngram["time_split"].values()) - 1) < 1e-3
    assert summary["outputs_identical"] is False
    same = identical_outputs(records, "ar", "ngram")
    assert same["checked"] == 4 and [m["first_difference_at"] for m in same["mismatches"]] == [1, 1]


def test_collapse_warning_tells_load_from_code():
    first, slow = rec("ar", "p", 0), rec("ar", "p", 1, seconds=3.0)  # half the wall tokens/s...
    first.extra["decode_cpu_s"] = slow.extra["decode_cpu_s"] = 0.5  # ...for the same CPU time: other tenants
    (w,) = collapse_warnings([first, slow])
    assert w["drop"] == 0.5 and w["cpu_time_drop"] == 0.0


def test_budget_per_config_and_auto_against_the_best_fixed_budget():
    """A sweep `budget=auto,8,32`: each config's per-step budgets summed over its runs, and auto's decode
    tokens/s over the best fixed budget's."""
    from treeflash.bench.report import format_table
    from treeflash.bench.sweep import parse_sweep

    assert parse_sweep("budget=auto,8,32").values == ("auto", 8, 32)
    records = []
    for run in range(2):
        for label, seconds, hist in (("ar", 2.0, None), ("dflash budget=auto", 1.2, {"0": 10, "32": 40}),
                                     ("dflash budget=8", 1.5, {"8": 50}), ("dflash budget=32", 1.25, {"32": 50})):
            r = rec(label, "p", run, seconds=seconds, tau=None if hist is None else 2.0)
            if hist is not None:
                r.spec["budget"] = {"mean": 0.0, "steps_per_budget": hist, "per_step": [], "per_step_truncated": True}
            records.append(r)
    values = {"dflash budget=auto": "auto", "dflash budget=8": 8, "dflash budget=32": 32}
    summary, _ = summarize(records, ["ar", *values], "ar", values)
    auto = summary["configs"][1]
    assert auto["budget"] == {"mean": 25.6, "steps_per_budget": {"0": 20, "32": 80}}
    avf = summary["auto_vs_best_fixed"]
    assert avf["best_fixed"] == "dflash budget=32" and avf["tokens_per_second_ratio"] == 1.25  # decode 0.20 s against 0.25 s
    assert "auto vs the best fixed budget" in format_table(summary)
    try:
        parse_sweep("num_draft=auto,2")
    except Exception as e:
        assert "integers" in str(e)
    else:
        raise AssertionError("num_draft=auto must be refused")
