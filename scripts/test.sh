#!/usr/bin/env bash
# Set up everything, then run the whole test suite (CPU; Triton kernels through the interpreter).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
# two workers, each test file on one worker (a file's interpreter checks run once per worker, cached):
# the kernel checks are single-threaded subprocesses, so on a 2-core machine this halves the wall time
python -m pytest -q -rs --durations=15 -n 2 --dist loadfile "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
