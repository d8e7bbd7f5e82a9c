#!/usr/bin/env bash
# Is the split-K attention (partials + a combine launch) still the fastest for a DDTree-48 verify at a short
# context? One device step per configuration (bench/device_step_time.py, greedy DDTree-48, SmolLM2 shape, 300 tokens
# of context in a 600-slot cache): the shipped splits against one split with wide key blocks (no combine launch;
# --balanced-splits 1 makes the kernel write its output directly) and two splits of 128 keys.
#
#   OUT=out/attn_wide bash bench/attn_wide_sweep.sh      # ~2 minutes on an H200
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/attn_wide}
mkdir -p "$OUT"
i=0
while read -r name args; do
  [ -z "$name" ] && continue
  timeout 60 python3 bench/device_step_time.py --trees 48 --greedy-only --replays 200 $args --out "$OUT/aw_$name.json" \
    > "$OUT/aw_$name.log" 2>&1
  echo "[$name] rc=$? $args"
  grep -E "^ *(draft|device-chain|device-ddtree-48) " "$OUT/aw_$name.log"
  i=$((i + 1))
done <<'CONFIGS'
default
direct_m16_n128 --balanced-splits 1 --attn-block-m 16 --attn-block-n 128
direct_m16_n256_w8 --balanced-splits 1 --attn-block-m 16 --attn-block-n 256 --attn-warps 8 --attn-stages 2
direct_m16_n256_w4 --balanced-splits 1 --attn-block-m 16 --attn-block-n 256 --attn-warps 4 --attn-stages 2
direct_m32_n256_w8 --balanced-splits 1 --attn-block-m 32 --attn-block-n 256 --attn-warps 8 --attn-stages 2
split2_m16_n128 --balanced-splits 2 --attn-block-m 16 --attn-block-n 128
CONFIGS
