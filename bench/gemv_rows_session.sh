#!/usr/bin/env bash
# gemv rows mode (kernels/gemv_rows.py; gemv.ROWS_MAX, ROWS_GROUP) on the H200, SmolLM2-135M shape,
# random weights, in one call (~3 minutes; writes under $OUT, default out/gemv_rows):
#   1. bench/gemv_rows_check.py: rows mode bit for bit the one-row calls on the GPU, and its time per
#      call against cuBLAS at 2 / 16 / 32 rows, groups of 1 / 4 / 8 / 32 rows a program;
#   2. verify graphs with the projections on cuBLAS (rows 0) and on the GEMV (rows 32) at groups 8
#      and 32, interleaved A/B/C/A/B/C (docs/performance.md).
#     OUT=out/gemv_rows bash bench/gemv_rows_session.sh
# Then, with the default model's GGUF in /tmp/smol.gguf, speed and bf16 identity on real prompts:
#     TREEFLASH_GEMV_ROWS=32 TREEFLASH_GEMV_ROWS_GROUP=8 python -m treeflash.train.evaluate --target /tmp/smol.gguf \
#         --drafter treeflash/assets/smollm2_dflash --device cuda --max-tokens 256 --out eval_rows.json
set -u
OUT=${OUT:-out/gemv_rows}
mkdir -p "$OUT"
python3 bench/gemv_rows_check.py --out "$OUT/gemv_rows_check.json" 2>&1 | grep -v Warning | tail -14
for round in 1 2; do
  for cfg in "0 8" "32 8" "32 32"; do
    set -- $cfg
    python3 bench/gpu_speed.py --shapes smollm2-135m --buckets 1,16,32 --prefill "" --decode-tokens 128 \
        --gemv-rows "$1" --gemv-rows-group "$2" --out "$OUT/smol_rows$1_g$2_r$round.json" 2>&1 | grep -v Warning \
        | grep -E "smollm2|verify" | sed "s/^/[rows $1 group $2] /" | head -6
  done
done
