#!/usr/bin/env bash
# gemv rows mode (kernels/gemv.py ROWS_MAX) on the H200, SmolLM2-135M shape, random weights: verify
# graphs with the projections on cuBLAS (0) and row by row on the GEMV (32), interleaved A/B/A/B in
# one call (docs/performance.md). Writes under $OUT (default out/gemv_rows); ~2 minutes.
#     OUT=out/gemv_rows bash bench/gemv_rows_session.sh
# Then, with the default model's GGUF in /tmp/smol.gguf, speed and bf16 identity on real prompts:
#     TREEFLASH_GEMV_ROWS=32 python -m treeflash.train.evaluate --target /tmp/smol.gguf \
#         --drafter treeflash/assets/smollm2_dflash --device cuda --max-tokens 256 --out eval_rows.json
set -u
OUT=${OUT:-out/gemv_rows}
mkdir -p "$OUT"
for rows in 0 32 0 32; do
  python3 bench/gpu_speed.py --shapes smollm2-135m --buckets 1,16,32 --prefill "" --decode-tokens 128 \
      --gemv-rows "$rows" --out "$OUT/smol_rows$rows.$RANDOM.json" 2>&1 | grep -v Warning \
      | grep -E "smollm2|verify|dflash" | sed "s/^/[rows $rows] /" | head -6
done
