"""bench/gen_speed_gpu.py (the H200 comparison of data-generation engines) runs on the CPU at a tiny
shape: every engine row is written, and the fp32 check finds the batched generator's greedy rows
identical to transformers'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gen_speed_script_on_a_tiny_shape(tmp_path):
    out = tmp_path / "gen.json"
    cmd = [sys.executable, "-m", "bench.gen_speed_gpu", "--shape", "tiny-dense", "--batches", "4", "--new", "6",
           "--hf-new", "2", "--check-rows", "3", "--prompt-len", "3,8", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    engines = {r["engine"]: r for r in res["runs"]}
    assert set(engines) == {"treeflash", "treeflash_sampled", "hf_dynamic"}
    assert engines["treeflash"]["tokens"] == 4 * 6 and engines["hf_dynamic"]["tokens"] == 4 * 2
    assert res["fp32_check"]["identical_rows"] == 3
