"""Triton quantize-on-write kernels equal their torch references bit for bit (TRITON_INTERPRET=1)."""

import pytest

from tests.kernels.interpret import run_group
from tests.kernels.interpret_checks import groups

pytest.importorskip("triton")
NAMES = list(groups()["quantize"])


@pytest.fixture(scope="module")
def results():
    return run_group("quantize")


@pytest.mark.parametrize("name", NAMES)
def test_quantize_kernel(results, name):
    assert results[name] is None, results[name]
