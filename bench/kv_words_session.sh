#!/usr/bin/env bash
# The "words" KV attention default on the H200 (docs/kv.md): every K/V pair's default checked and timed
# at 32K/128K, the head_dim 128 sweep (8B shape), the 27B-shaped model at 128K, and Nsight Compute
# on the q8_0/q8_0 decode kernel. Writes under $OUT (default out/kv_words).
#     OUT=out/kv_words bash bench/kv_words_session.sh
set -u
OUT=${OUT:-out/kv_words}
mkdir -p "$OUT"
python3 bench/kv_attention_gpu.py --out "$OUT/kv_attention_gpu.json" 2>&1 | grep -v Warning | tail -45
python3 bench/kv_attention_gpu.py --sweep --sweep-pairs q8_0/q8_0 q4_0/q4_0 --sweep-variants flat_n32_w4 fast_n64_w4 words_n32_w4 \
    --heads 32 --kv-heads 8 --head-dim 128 --contexts 32768 131072 --sweep-budget-s 150 --out "$OUT/kv_attention_sweep_hd128.json" 2>&1 | grep -v Warning | tail -12
python3 bench/kv_long_decode.py --shape qwen3.5-27b --contexts 131072 --types bf16/bf16,q8_0/q8_0,q4_0/q4_0 --decode-tokens 16 \
    --out "$OUT/kv_long_decode_words.json" 2>&1 | grep -v Warning | tail -12
if command -v ncu >/dev/null; then
  for v in "" "--variant flat_n32_w4"; do
    timeout 120 ncu --clock-control none --kernel-name regex:_partial_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      python3 bench/kv_attention_ncu.py --pair q8_0/q8_0 --context 131072 $v > "$OUT/ncu_q8_q8_128k${v:+_flat}.txt" 2>&1
    grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slot|Stall|One or More" "$OUT/ncu_q8_q8_128k${v:+_flat}.txt" | head -30
  done
fi
