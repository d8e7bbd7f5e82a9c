"""The commit kernels (kernels/commit.py: attention rows, K and V in one launch; the conv window in
place) equal their references bitwise through the Triton interpreter on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_commit_kernels_match_references():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.commit_checks"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result) == 8
    assert all(result.values()), result


def test_commit_kernels_reject_bad_input():
    from treeflash.kernels import commit

    saved = commit._interpreting
    commit._interpreting = lambda: True  # the wrappers' checks run before any launch
    try:
        with pytest.raises(ValueError, match="row size"):
            commit.commit_rows(torch.zeros(4, 8), torch.zeros(4, 6), torch.arange(2), torch.arange(2), torch.tensor([2]))
        with pytest.raises(ValueError, match="taps"):
            commit.conv_window_commit(torch.zeros(8, 5), torch.zeros(2, 8), torch.arange(5))
    finally:
        commit._interpreting = saved
