"""Triton attention over the compressed cache (decode, tree verify, split-K, GQA) equals
dequantize + SDPA, for every K/V format pair (TRITON_INTERPRET=1)."""

import pytest

from tests.kernels.interpret import run_group
from tests.kernels.interpret_checks import groups

pytest.importorskip("triton")
NAMES = list(groups()["attention"])


@pytest.fixture(scope="module")
def results():
    return run_group("attention")


@pytest.mark.parametrize("name", NAMES)
def test_quant_attention_kernel(results, name):
    assert results[name] is None, results[name]
