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
echo "treeflash is installed in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
