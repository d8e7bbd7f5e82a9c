"""The one-row GEMV (kernels/gemv.py: unrolled CUDA-core steps, split-K with a ticket reduce) equals
its reference through the Triton interpreter on the CPU: fp32 to rounding, bf16 to one output
rounding (both accumulate in fp32 and round once)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype,rel", [("float32", 2e-6), ("bfloat16", 2**-7)])
def test_gemv_matches_reference(dtype, rel):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.gemv_checks", dtype], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(errors) == 6
    for case, (err, scale, same) in errors.items():
        assert err <= rel * max(scale, 1.0), (case, err, scale)
        assert same, case  # deterministic, and the tickets were reset for the next call


def test_gemv_rejects_bad_input():
    from treeflash.kernels import gemv as g

    g_interp = g._interpreting
    g._interpreting = lambda: True  # the wrapper's checks run before any launch
    try:
        with pytest.raises(ValueError, match="x must be"):
            g.gemv(torch.randn(2, 8), torch.randn(4, 8))
        with pytest.raises(ValueError, match="bias"):
            g.gemv(torch.randn(1, 8), torch.randn(4, 8), torch.randn(3))
        with pytest.raises(ValueError, match="contiguous"):
            g.gemv(torch.randn(1, 8), torch.randn(8, 4).t())
        with pytest.raises(ValueError, match="power of two"):
            g.GemvConfig(6, 32, 1, 4)
    finally:
        g._interpreting = g_interp


def test_gemv_on_cpu_is_the_reference():
    from treeflash.kernels.gemv import gemv, gemv_reference

    x, w, b = torch.randn(1, 16), torch.randn(5, 16), torch.randn(5)
    assert torch.equal(gemv(x, w, b), gemv_reference(x, w, b))
    assert gemv(x[0], w).shape == (5,)
