"""Fused decode kernels (norms, rotary, SiLU-mul, Gated DeltaNet step) equal their references,
run through the Triton interpreter on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("group", ["norms", "rotary", "activation", "gdn", "gdn_tree"])
def test_kernel_matches_reference(group):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.linear.fused_checks", group], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert errors and all(e < 1e-4 for e in errors.values()), errors


def test_rmsnorm_writes_out_rows_on_the_cpu_path():
    import torch

    from treeflash.kernels.pointwise.norm import rmsnorm, rmsnorm_ref

    x, w = torch.randn(3, 8), torch.randn(8)
    buf = torch.zeros(5, 8)
    y, _ = rmsnorm(x, w, 1e-6, out=buf[2:])
    assert torch.equal(buf[2:], rmsnorm_ref(x, w, 1e-6)[0]) and y.data_ptr() == buf[2:].data_ptr()
    assert bool((buf[:2] == 0).all())
    with pytest.raises(ValueError, match="rmsnorm: out"):
        rmsnorm(x, w, 1e-6, out=torch.zeros(3, 8, dtype=torch.float64))
