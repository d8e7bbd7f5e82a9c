"""Run a snippet of kernel checks under TRITON_INTERPRET=1 in a fresh interpreter (the flag is read when triton
is imported, so it cannot be set inside the test process) and return the JSON it prints last."""

import json
import os
import subprocess
import sys


def run_interpreted(code: str, timeout: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
