"""/metrics' budget families from the engine's totals: steps per budget (a counter) and the per-step
budget as a histogram (cumulative buckets of draft nodes), read at scrape time."""

from types import SimpleNamespace

from treeflash.server.metrics import Metrics
from treeflash.spec.stats import SpecStats


def test_steps_per_budget_and_the_budget_histogram():
    totals = SpecStats()
    for nodes in (0, 0, 0, 8, 32, 32):  # three plain steps, one tree of 8 nodes, two of 32
        totals.record(1 if nodes else 0, 0, nodes)
    worker = SimpleNamespace(engine=SimpleNamespace(totals=totals, max_context=128, config=None, cache=None),
                             queue_depth=0, busy=False, state="ready")
    text = Metrics(worker, "m").render().decode()
    assert 'treeflash_spec_steps_by_budget_total{budget="0"} 3.0' in text
    assert 'treeflash_spec_steps_by_budget_total{budget="32"} 2.0' in text
    assert 'treeflash_spec_step_budget_bucket{le="0"} 3.0' in text
    assert 'treeflash_spec_step_budget_bucket{le="16"} 4.0' in text
    assert 'treeflash_spec_step_budget_bucket{le="+Inf"} 6.0' in text
    assert "treeflash_spec_step_budget_sum 72.0" in text and "treeflash_spec_step_budget_count 6.0" in text
