"""`treeflash generate` as a process: the text on stdout, then the one-line summary on stderr on a
line of its own, also when both streams go to one pipe (`2>&1`) and stdout is block-buffered."""

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.models.test_loaders import random_hf, write_gguf

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"\[treeflash\] 6 tokens in [\d.]+ s: [\d.]+ tokens/s \(prompt \d+ tokens, first token \d+ ms, decode [\d.]+ tokens/s\)")


def test_generate_summary_on_its_own_line(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", random_hf("llama"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "treeflash.cli.main", "generate", "--model", str(path), "--prompt", "abc",
           "--max-tokens", "6", "--ignore-eos", "--quiet", "--device", "cpu", "--threads", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert proc.stdout.endswith("\n")
    lines = proc.stdout.splitlines()
    assert SUMMARY.fullmatch(lines[-1]), proc.stdout  # the summary alone on the last line
    assert lines[-2] and "[treeflash]" not in lines[-2]  # the generated text, ended by its newline
