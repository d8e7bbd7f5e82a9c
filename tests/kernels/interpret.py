"""Run kernel checks (tests/kernels/*_checks.py) in a subprocess under TRITON_INTERPRET=1 (the
interpreter is chosen when triton is imported, so not in the pytest process)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, timeout: int = 600):
    """Run `python -m module args` under TRITON_INTERPRET=1 in a subprocess; its last stdout line, as JSON."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.cache
def run_group(group: str) -> dict[str, str | None]:
    """Every check of a group (tests/kernels/interpret_checks.py) in one subprocess, once per session:
    name -> None (passed) or what failed."""
    return run_module("tests.kernels.interpret_checks", group)


def assert_check(group: str, name: str) -> None:
    """One check of a group passed (the test files parametrize over a group's names)."""
    result = run_group(group)[name]
    assert result is None, result


def assert_all_passed(results: dict[str, str | None], expected: int) -> None:
    """Every check of a run_module result passed (name -> None), and all `expected` of them ran."""
    bad = {name: err for name, err in results.items() if err is not None}
    assert not bad, "\n".join(f"{name}: {err}" for name, err in bad.items())
    assert len(results) == expected
