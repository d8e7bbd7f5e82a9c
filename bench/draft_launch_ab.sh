#!/usr/bin/env bash
# Stop 25's draft-pass launch cuts, timed on the GPU against the old ops (written blind on the CPU, where
# their tokens are checked; see docs/performance.md "Stop 25"). Each variable "0" restores one of them:
#   TREEFLASH_DRAFT_SKIP_MASK  full draft layers build and read no [B, S] key mask (attention's ALL_VISIBLE)
#   TREEFLASH_DRAFT_SLOTS      slots + rotary rows in one launch (kernels/draft_slots.py)
#   TREEFLASH_DRAFT_ROWS       no torch.cat a draft layer (rmsnorm writes into one [n + B, H] buffer)
# (the block's token ids sharing the ints buffer has no switch: it is two launches fewer either way)
#
#   OUT=out/draft_ab bash bench/draft_launch_ab.sh        # ~2 minutes on an H200, after gpu_check
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/draft_ab}
mkdir -p "$OUT"
while read -r name envs; do
  [ -z "$name" ] && continue
  env $envs timeout 90 python3 bench/device_step_time.py --trees 48 --greedy-only --replays 300 --out "$OUT/da_$name.json" \
    > "$OUT/da_$name.log" 2>&1
  echo "[$name] rc=$? $envs"
  grep -E "^ *(draft|device-chain|device-ddtree-48) " "$OUT/da_$name.log"
done <<'CONFIGS'
new TREEFLASH_DRAFT_SKIP_MASK=1
old TREEFLASH_DRAFT_SKIP_MASK=0 TREEFLASH_DRAFT_SLOTS=0 TREEFLASH_DRAFT_ROWS=0
no_skip_mask TREEFLASH_DRAFT_SKIP_MASK=0
no_slots TREEFLASH_DRAFT_SLOTS=0
no_rows TREEFLASH_DRAFT_ROWS=0
new_again TREEFLASH_DRAFT_SKIP_MASK=1
CONFIGS
