"""bench/gpu_check.py's quant_kernels section (every default GGUF-block route against its reference, run on the
H200 with the inline PTX) at toy shapes through the Triton interpreter, so the check itself stays runnable."""

from tests.kernels.quant.interpreted import run_interpreted

CHECK = r"""
import json
from bench.gpu_check import quant_kernels_check
print(json.dumps(quant_kernels_check("cpu", shapes=((20, 512),), rows_shape=(16, 256))))
"""


def test_quant_kernels_section_passes_in_the_interpreter():
    res = run_interpreted(CHECK, timeout=600)
    assert res["ok"], res
    assert sorted(k for k in res if k.endswith("_m32_rel_err")) == ["Q4_K_m32_rel_err", "Q6_K_m32_rel_err"]
    assert len([k for k in res if "_m1_" in k]) == 10, res  # four formats and Q6_K's lanes: exact sums and the 8-bit rounding of x
