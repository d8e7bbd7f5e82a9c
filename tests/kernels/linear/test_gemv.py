"""The one-row GEMV (kernels/linear/gemv.py: unrolled CUDA-core steps, split-K with a ticket reduce) equals
its reference through the Triton interpreter on the CPU: fp32 to rounding, bf16 to one output
rounding (both accumulate in fp32 and round once)."""

import pytest
import torch

from tests.kernels.interpret import run_module


def assert_cases(mode_args: tuple[str, ...], count: int, rel: float, check_same: bool = True) -> None:
    """gemv_checks' cases for one mode: `count` of them, each within rel x max(reference, 1) of its
    reference, and (check_same) its third field true (deterministic / tickets reset / stream written)."""
    errors = run_module("tests.kernels.linear.gemv_checks", *mode_args)
    assert len(errors) == count
    for case, (err, scale, same) in errors.items():
        assert err <= rel * max(scale, 1.0), (case, err, scale)
        assert same or not check_same, case


@pytest.mark.parametrize("dtype,rel", [("float32", 2e-6), ("bfloat16", 2**-7)])
def test_gemv_matches_reference(dtype, rel):
    assert_cases((dtype,), 8, rel)


@pytest.mark.parametrize("dtype,rel", [("float32", 1e-5), ("bfloat16", 2**-6)])
def test_gemv_swiglu_matches_reference(dtype, rel):
    """gate and up rows in one program, SiLU-mul in the epilogue; bf16: g and u round to bf16 first
    on both sides, so only the fp32 summation order differs (one ulp of g or u at most)."""
    assert_cases((dtype, "swiglu"), 3, rel, check_same=False)


def test_projection_routing(monkeypatch):
    """projection.linear sends one row of a shape in the given tables to gemv, with that entry's
    configuration, and only then (several rows, other shapes, the default tables: cuBLAS)."""
    from treeflash.kernels.linear import gemv as g
    from treeflash.kernels.linear import projection

    w = torch.randn(8, 16)
    cfg = g.GemvConfig(4, 16, 1, 1)
    tables = g.TUNED.with_entries(linear={(8, 16): cfg})
    assert (8, 16) in tables.linear and (8, 16) not in g.TUNED.linear  # a new table; the shipped one unchanged
    table = tables.linear
    monkeypatch.setattr(projection, "_interpreting", lambda: True)
    assert projection._takes_gemv(torch.randn(1, 16), w, table) and not projection._takes_gemv(torch.randn(4, 16), w, table)
    assert not projection._takes_gemv(torch.randn(1, 16), torch.randn(8, 15).t().contiguous().t(), table)  # strided
    assert not projection._takes_gemv(torch.randn(1, 12), torch.randn(9, 12), table)  # not a tuned shape
    seen = []
    monkeypatch.setattr(g, "gemv", lambda x, weight, bias=None, config=None, add_into=None: seen.append(config) or x @ weight.t())
    projection.linear(torch.randn(1, 16), w, tables=tables)
    projection.linear(torch.randn(1, 16), w)  # the shipped tables: no entry, cuBLAS
    assert seen == [cfg]


def test_gemv_tables_are_read_only_and_validated():
    from treeflash.kernels.linear import gemv as g

    with pytest.raises(TypeError):
        g.TUNED.linear[(8, 16)] = g.GemvConfig(4, 16, 1, 1)
    with pytest.raises(ValueError, match="split_k 1"):
        g.GemvTables(swiglu={(8, 16): g.GemvConfig(4, 16, 2, 1)})
    with pytest.raises(ValueError, match="weight shapes"):
        g.GemvTables(linear={(8, 0): g.GemvConfig(4, 16, 1, 1)})
    assert g.TUNED.without_swiglu().swiglu == {} and g.TUNED.without_swiglu().linear == g.TUNED.linear
    import copy
    import pickle

    assert copy.deepcopy(g.TUNED) is g.TUNED and pickle.loads(pickle.dumps(g.TUNED)) == g.TUNED  # a model deep-copies


def test_gemv_rejects_bad_input():
    from treeflash.kernels.linear import gemv as g

    g_interp = g._interpreting
    g._interpreting = lambda: True  # the wrapper's checks run before any launch
    try:
        with pytest.raises(ValueError, match="x must be"):
            g.gemv(torch.randn(2, 7), torch.randn(4, 8))
        with pytest.raises(ValueError, match="x must be"):
            g.gemv(torch.randn(2, 8), torch.randn(4, 8))  # one row only on the kernel path
        with pytest.raises(ValueError, match="bias"):
            g.gemv(torch.randn(1, 8), torch.randn(4, 8), torch.randn(3))
        with pytest.raises(ValueError, match="contiguous"):
            g.gemv(torch.randn(1, 8), torch.randn(8, 4).t())
        with pytest.raises(ValueError, match="power of two"):
            g.GemvConfig(6, 32, 1, 4)
    finally:
        g._interpreting = g_interp


def test_gemv_on_cpu_is_the_reference():
    from treeflash.kernels.linear.gemv import gemv, gemv_reference

    x, w, b = torch.randn(1, 16), torch.randn(5, 16), torch.randn(5)
    assert torch.equal(gemv(x, w, b), gemv_reference(x, w, b))
    assert gemv(x[0], w).shape == (5,)
    assert gemv(torch.randn(3, 16), w).shape == (3, 5)


@pytest.mark.parametrize("dtype,rel", [("float32", 1e-5), ("bfloat16", 2**-6)])
def test_gemv_folded_epilogues_match_reference(dtype, rel):
    """A folded layer's GEMVs (models.transformer.forward_folded on one token): the residual add in gemv's
    epilogue, in place, split 1 and split-K (the reducer adds it); gemv_swiglu times 1 / rms(x) from its own
    pass over x (silu_mul's rows), deterministic. bf16: g and u round before the scale on both sides; the
    rms sums in another order (one ulp)."""
    assert_cases((dtype, "fold"), 6, rel)


def test_gemv_add_into_and_rows_reject_misuse():
    from treeflash.kernels.linear.gemv import gemv, gemv_swiglu

    x, w = torch.randn(1, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="add_into"):
        gemv(x, w, add_into=torch.zeros(1, 5))
    with pytest.raises(ValueError, match="add_into"):
        gemv(x, w, add_into=torch.zeros(1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="rows"):
        gemv_swiglu(x, torch.randn(6, 8), rows=(x.clone(), 1e-6))  # the scale must come from x itself
    s = torch.ones(1, 4)
    got = gemv(x, w, add_into=s)  # the CPU reference: in place, one rounding
    assert got is s and torch.allclose(s, 1 + x @ w.t(), atol=1e-6)


def test_cpu_padded_linear_pads_three_rows_and_keeps_the_values(monkeypatch):
    """On a CPU a 3-row fp32 projection (and the head at 2 or 3 rows) runs as 4 rows: MKL takes 2-3 rows one
    matrix-vector product at a time (the head: 43 ms at 3 rows, 25 ms at 4; kernels/linear/projection.py). The kept
    rows equal F.linear's to fp32 rounding; other row counts and dtypes pass through unpadded."""
    import torch.nn.functional as F

    from treeflash.kernels.linear import projection

    seen = []
    real = F.linear

    def spy(x, w, b=None):
        seen.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(projection.F, "linear", spy)
    w, b = torch.randn(40, 24), torch.randn(40)
    for m in range(1, 6):
        x = torch.randn(m, 24)
        got = projection.cpu_padded_linear(x, w, b)
        head = projection.cpu_padded_linear(x, w, rows=projection.CPU_PAD_HEAD_ROWS)
        assert got.shape == (m, 40) and head.shape == (m, 40)
        assert torch.allclose(got, real(x, w, b), atol=1e-5) and torch.allclose(head, real(x, w), atol=1e-5)
    assert seen == [1, 1, 2, 4, 4, 4, 4, 4, 5, 5]  # projections pad 3 rows, the head 2 and 3
    seen.clear()
    projection.cpu_padded_linear(torch.randn(3, 24, dtype=torch.float64), w.double())
    assert seen == [3]  # fp32 only
