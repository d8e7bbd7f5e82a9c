#!/usr/bin/env bash
# Set up everything, then run the whole test suite (CPU; Triton kernels through the interpreter).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
python -m pytest -q -rs --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
