"""Triton quantize-on-write kernels equal their torch references bit for bit (TRITON_INTERPRET=1)."""

import pytest

from tests.kernels.interpret import assert_check
from tests.kernels.interpret_checks import groups

pytest.importorskip("triton")
NAMES = list(groups()["quantize"])


@pytest.mark.parametrize("name", NAMES)
def test_quantize_kernel(name):
    assert_check("quantize", name)
