"""bench/dp4a_ab.py: every route it times is a valid tuning of its format (the default first, distinct labels), and
one toy projection is checked and timed end to end under the interpreter (in a subprocess)."""

from bench import dp4a_ab
from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import argparse, json
from bench import dp4a_ab
args = argparse.Namespace(device="cpu", bandwidth=4.2e12, rep_ms=1)
rec = dp4a_ab.bench_projection("toy.q8_0", "Q8_0", 24, 1024, args)
print(json.dumps(rec))
"""


def test_routes_are_distinct_tunings_with_the_default_first():
    for fmt in ("Q4_K", "Q6_K", "Q8_0"):
        routes = dp4a_ab.routes(fmt)
        labels = [label for label, _ in routes]
        assert labels[0] == "default" and len(set(labels)) == len(labels), labels
        assert len({t for _, t in routes}) == len(routes), fmt  # frozen dataclasses: no two routes alike
    q6 = dict(dp4a_ab.routes("Q6_K"))
    assert q6["lanes bn8 w4 mp4224"].q6k_gemv_route == "lanes"
    assert q6["dp4a fused"].q6k_dp4a.fused_split and not q6["default"].q6k_dp4a.fused_split


def test_a_toy_projection_is_checked_and_timed():
    rec = run_interpreted(CHECK, timeout=600)
    assert [r["route"] for r in rec["routes"]] == ["default", "fused"], rec
    assert all(r["error"] < 1e-2 and r["s"] > 0 for r in rec["routes"]), rec
    assert rec["best"] in ("default", "fused")


def test_route_strings_take_the_split_flag():
    import pytest

    from bench.gpu_shapes import quant_tuning

    t = quant_tuning("///lanes+fused")
    assert t.q6k_gemv_route == "lanes" and t.q6k_lanes.fused_split and t.q4k_dp4a.fused_split and t.q3k_dp4a.fused_split
    assert not quant_tuning("+unfused").q8_0_dp4a.fused_split
    with pytest.raises(ValueError, match=r"\+fused, \+unfused"):
        quant_tuning("dp4a+atomic")
