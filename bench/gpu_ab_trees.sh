#!/usr/bin/env bash
# A/B of two source trees on the H200 in one call: decode + verify 1/32 of one shape, runs interleaved
# (A, B, B+env, A, B, B+env, ...), so both sides see the same machine, clocks and caches.
#
#   git archive HEAD~1 bench treeflash | tar -x -C .gpu_old      # the "before" tree (ignored folder)
#   OLD=.gpu_old SHAPE=qwen3.5-27b ROUNDS=2 EXTRA="TREEFLASH_TREE_OUT_SPLIT=1" CHECK_ENV="TREEFLASH_TREE_OUT_SPLIT=1" \
#     OUT=$OUT bash bench/gpu_ab_trees.sh
#
# The "after" tree is this checkout. CHECK_ENV (optional): run bench/gpu_check.py first, with that
# environment, on the after tree (its exactness gate; without flash-linear-attention on the path).
# EXTRA (optional): a third variant, the after tree with that environment.
# Writes $OUT/ab_{old,new,extra}_{round}.json and .log, gpu_check.json; prints each run's decode
# and verify lines. Environment: OLD, SHAPE (default qwen3.5-27b), ROUNDS (default 2), EXTRA,
# CHECK_ENV, LIMIT (seconds per run, default 90), OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
NEW=$PWD
OLD=$(cd "${OLD:?OLD: the before tree}" && pwd)
SHAPE=${SHAPE:-qwen3.5-27b}
ROUNDS=${ROUNDS:-2}
EXTRA=${EXTRA:-}
LIMIT=${LIMIT:-90}
OUT=${OUT:-out/gpu_ab_trees}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
log() { echo "[gpu-ab $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.log"; }

SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core*.whl .whl/flash_linear*.whl .whl/einops*.whl \
    >/dev/null 2>&1 && SITE=/tmp/site
fi

if [ -n "${CHECK_ENV:-}" ]; then
  log "gpu_check with $CHECK_ENV"
  env $CHECK_ENV timeout 140 python3 bench/gpu_check.py --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1
  log "gpu_check rc=$? $(grep -E 'GPU CHECK' "$OUT/gpu_check.log" || echo 'no verdict: see gpu_check.log')"
fi

run() {  # name tree env...
  local name=$1 tree=$2
  shift 2
  log "$name ($tree) $*"
  (cd "$tree" && env "$@" PYTHONPATH="$tree:$SITE" timeout "$LIMIT" python3 bench/gpu_speed.py --shapes "$SHAPE" --buckets 1,32 \
    --prefill "" --drafter-layers 0 --decode-tokens 64 --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1)
  log "rc=$?"
  grep -E "decode|nodes" "$OUT/$name.log" | tee -a "$OUT/progress.log"
}

for r in $(seq 1 "$ROUNDS"); do
  run "ab_old_$r" "$OLD" TREEFLASH_AB=old
  run "ab_new_$r" "$NEW" TREEFLASH_AB=new
  [ -n "$EXTRA" ] && run "ab_extra_$r" "$NEW" $EXTRA
done
log "done"
