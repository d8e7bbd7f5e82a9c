#!/usr/bin/env bash
# Train the shipped DFlash drafter for the embedded default (SmolLM2-135M-Instruct) on a CPU, export
# it into the package (treeflash/assets/smollm2_dflash) and measure it on the held-out prompts.
# This is how the drafter in the repository was made (docs/train.md has the figures).
#
#   bash bench/train_default_drafter_cpu.sh            # all stages, ~2.5 h on 2 cores
#   STAGES="eval" bash bench/train_default_drafter_cpu.sh   # one stage again (data, train, export, eval)
#
# Stages:
#   data    the target answers the builtin prompts, greedy, 64 at a time, <= 256 new tokens each,
#           for at most 45 min or 150K response tokens (1 thread: ~40 tokens/s)
#   train   3 draft layers, block 8 (7 drafted tokens per pass), the target's features captured once
#           (--cache-features on), 16 sequences x 16 anchors per step, peak LR 1e-3, gamma 4,
#           fitted into TRAIN_S seconds
#   export  the bf16 drafter (shards < 12 MB) into treeflash/assets/smollm2_dflash
#   eval    python -m treeflash.train.evaluate on the 20 held-out prompts: the 10 HumanEval and the
#           10 chat prompts as two processes of 1 thread each; greedy, plain vs DFlash chain vs
#           DDTree 8/16/22/32 and auto
set -eu -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=${WORK:-/work/drafter_run/smol}
OUT=${OUT:-out/train_default_drafter_cpu}
ASSET=treeflash/assets/smollm2_dflash
TRAIN_S=${TRAIN_S:-2700}
TRAIN_THREADS=${TRAIN_THREADS:-2}
EVAL_TOKENS=${EVAL_TOKENS:-128}
STAGES=${STAGES:-"data train export eval"}
mkdir -p "$OUT"

has() { [[ " $STAGES " == *" $1 "* ]]; }

if has data; then
  OMP_NUM_THREADS=1 $PY -m treeflash.cli.main train-drafter --out "$WORK" --device cpu --layers 3 --block-size 8 \
    --tokens 150000 --max-new-tokens 256 --max-len 768 --gen-batch-size 64 --gen-time-limit 2700 --generate-only
fi
if has train; then
  OMP_NUM_THREADS=$TRAIN_THREADS $PY -m treeflash.cli.main train-drafter --out "$WORK" --device cpu --resume \
    --cache-features on --steps 4000 --batch-size 16 --blocks-per-seq 16 --lr 1e-3 --gamma 4 \
    --eval-every 100 --checkpoint-every 200 --time-limit "$TRAIN_S" --max-shard-mb 12 2>&1 | tr '\r' '\n' | grep -v '^$' > "$OUT/train.log"
  cp "$WORK/train/summary.json" "$OUT/train_summary.json"
  cp "$WORK/train/log.jsonl" "$OUT/train_log.jsonl"
  $PY -c "
import json
from safetensors import safe_open
print(json.dumps(json.loads(safe_open('$WORK/train/data.safetensors', 'pt').metadata()['meta']), indent=2))" > "$OUT/data_meta.json"
fi
if has export; then
  rm -rf "$ASSET" && mkdir -p "$ASSET"
  cp "$WORK"/config.json "$WORK"/*.safetensors "$ASSET/"
  cp "$WORK"/model.safetensors.index.json "$ASSET/" 2>/dev/null || true
  ls -l "$ASSET"
fi
if has eval; then  # the 10 HumanEval and the 10 chat prompts as two processes, one core each
  for half in code chat; do
    skip=0; [ "$half" = chat ] && skip=10
    OMP_NUM_THREADS=1 $PY -m treeflash.train.evaluate --drafter "$ASSET" --out "$OUT/eval_cpu_$half.json" --device cpu \
      --skip $skip --num-prompts 10 --max-tokens "$EVAL_TOKENS" --budgets 8 16 22 32 auto > "$OUT/eval_cpu_$half.log" 2>&1 &
  done
  wait
  for half in code chat; do echo "== $half"; grep '^\[eval\] *[a-z0-9-]*:' "$OUT/eval_cpu_$half.log"; done
fi
