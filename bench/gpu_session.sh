#!/usr/bin/env bash
# One H200 call that checks and measures the state of the GPU path, each stage with its own time
# limit so the whole fits the device's 600 s per call (about 7-8 minutes):
#
#   bash bench/gpu_session.sh            # writes into $OUT (default out/gpu_session)
#
# 1. correctness   bench/gpu_check.py                    -> gpu_check.json   (<= 150 s)
# 2. speed         bench/gpu_speed.py, both shapes, decode + verify 1/32 + prefill 4K/32K
#                                                        -> gpu_speed.json   (<= 240 s)
# 3. KV attention  bench/kv_attention_gpu.py --sweep over the q8_0-K pairs (the int8 q.k variants
#                  among them)                           -> kv_attention_sweep.json (<= 170 s)
# Wheels in .whl/ (flash-linear-attention, fla-core, einops) are installed offline into /tmp/site
# and put on the path for stages 2-3 only: gpu_check compares against transformers, which would
# route its own Gated DeltaNet to fla if it could import it.
# Environment: STAGES (default "check speed kv"), OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_session}
STAGES=${STAGES:-check speed kv}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu-session $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.log"; }

SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 && SITE=/tmp/site \
    || log "pip install of .whl/ failed: prefill without flash-linear-attention"
fi

for stage in $STAGES; do
  case "$stage" in
    check)
      log "gpu_check"
      timeout 150 python3 bench/gpu_check.py --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1
      log "gpu_check rc=$? $(grep -E 'GPU CHECK' "$OUT/gpu_check.log" || echo 'no verdict: see gpu_check.log')" ;;
    speed)
      log "gpu_speed"
      PYTHONPATH=$SITE timeout 240 python3 bench/gpu_speed.py --shapes qwen3.5-27b,qwen3-8b --buckets 1,32 \
        --prefill 4096,32768 --drafter-layers 0 --decode-tokens 64 --out "$OUT/gpu_speed.json" > "$OUT/gpu_speed.log" 2>&1
      log "gpu_speed rc=$?"
      grep -E "copy bandwidth|decode|32 nodes|prefill" "$OUT/gpu_speed.log" | tee -a "$OUT/progress.log" ;;
    kv)
      log "kv_attention sweep (q8_0 K pairs)"
      PYTHONPATH=$SITE timeout 170 python3 bench/kv_attention_gpu.py --sweep --sweep-pairs q8_0/q8_0 q8_0/tq3_0 q8_0/bf16 \
        --sweep-budget-s 150 --out "$OUT/kv_attention_sweep.json" > "$OUT/kv_attention.log" 2>&1
      log "kv_attention rc=$?"
      tail -n 25 "$OUT/kv_attention.log" | tee -a "$OUT/progress.log" ;;
    *) log "unknown stage $stage (check, speed, kv)" ;;
  esac
done
log "done"
