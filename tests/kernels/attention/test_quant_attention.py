"""Triton attention over the compressed cache (decode, tree verify, split-K, GQA) equals
dequantize + SDPA, for every K/V format pair (TRITON_INTERPRET=1)."""

import pytest

from tests.kernels.interpret import assert_check
from tests.kernels.interpret_checks import groups

pytest.importorskip("triton")
NAMES = list(groups()["attention"])


@pytest.mark.parametrize("name", NAMES)
def test_quant_attention_kernel(name):
    assert_check("attention", name)
