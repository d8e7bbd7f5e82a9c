#!/usr/bin/env bash
# Install treeflash into a virtual environment: the build steps of docker/Dockerfile and
# docker/Dockerfile.cpu, kept as plain commands so they also run (and are tested) outside Docker.
#
#   docker/install.sh PREFIX FLAVOR PACKAGE
#     PREFIX   the virtual environment (created if absent; the images use /opt/treeflash)
#     FLAVOR   cpu: PyTorch's CPU build (no CUDA libraries), treeflash without extras
#              cuda: PyTorch's CUDA build, treeflash[cuda] (flash-linear-attention for the Qwen3.5/3.6 prefill)
#     PACKAGE  what pip installs: a source directory or a built wheel
#   TORCH_VERSION, TORCH_INDEX_URL (Docker build args) choose the PyTorch build; pip's own PIP_*
#   variables apply. An environment that already imports torch keeps it (as scripts/setup.sh does).
#   Triton compiles small launcher stubs with the system C compiler when a kernel first runs on a
#   GPU: the CUDA image installs gcc and the Python headers for it.
set -euo pipefail
if [ $# -ne 3 ] || { [ "$2" != cpu ] && [ "$2" != cuda ]; }; then
  echo "usage: $0 PREFIX cpu|cuda PACKAGE" >&2
  exit 2
fi
PREFIX=$1
FLAVOR=$2
PACKAGE=$3
if [ "$FLAVOR" = cpu ]; then
  TORCH_VERSION=${TORCH_VERSION:-2.13.0}
  TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
  EXTRA=""
else
  TORCH_VERSION=${TORCH_VERSION:-2.11.0}
  TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}
  EXTRA="[cuda]"
fi

[ -x "$PREFIX/bin/python" ] || python3 -m venv "$PREFIX"
PY="$PREFIX/bin/python"
"$PY" -m pip --version >/dev/null 2>&1 || "$PY" -m ensurepip --upgrade >/dev/null
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --no-cache-dir "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
fi
# a range in treeflash's requirements (torch>=2.4) keeps this torch build in place
"$PY" -m pip install --no-cache-dir "$PACKAGE$EXTRA"
"$PREFIX/bin/treeflash" serve --help >/dev/null
echo "treeflash is installed in $PREFIX ($("$PY" -c 'import torch; print("torch", torch.__version__)'), $FLAVOR)"
