#!/usr/bin/env bash
# One H200 call that checks and measures the state of the GPU path, each stage with its own time
# limit so the whole fits the device's 600 s per call (about 8-9 minutes with the default stages):
#
#   bash bench/gpu_session.sh            # writes into $OUT (default out/gpu_session)
#   STAGES="check kv" bash bench/gpu_session.sh
#
# check      bench/gpu_check.py                                     -> gpu_check.json     (<= 200 s)
# gdn        bench/gdn_kernels_gpu.py: the Gated DeltaNet verify walk against its OUT_SPLIT variants
#            and the chunked (tf32x3) form on chain-16/32 and DDTree-32      -> gdn_kernels.json (<= 80 s)
# verify_ab  bench/gpu_speed.py, decode + verify 1/32, each opt-in against the speed stage's defaults:
#            27B with the chunked tree form (TREEFLASH_TREE_CHUNK=32) -> ab_chunk.json, 8B with the norm
#            prologue on qkv and gate_up (TREEFLASH_GEMV_NORM_IN=1) -> ab_normin.json, and on qkv only
#            (=qkv) -> ab_normin_qkv.json (<= 70 s each; the OUT_SPLIT walk: the gdn stage)
# speed      bench/gpu_speed.py, both shapes, decode + verify 1/32 + prefill 4K/32K -> gpu_speed.json (<= 160 s)
# folded_ab  bench/gpu_speed.py, decode + verify 1: the 8B shape without and with --folded-decode, twice interleaved
#            (off on off on), then the SmolLM2 shape the same way -> folded_{off,on}_{8b,smol}_{1,2}.json (<= 60 s each)
# profile_folded  bench/gpu_profile.py, kernel by kernel, the 8B and SmolLM2 shapes without and with
#            --folded-decode, with PDL and without -> profile_{default,folded}_{shape}[_nopdl].json (<= 60 s each);
#            PROFILE_PDL ("1 0"), PROFILE_SHAPES ("qwen3-8b smollm2-135m"), PROFILE_MODES ("default folded") narrow it
# eval_folded  with /tmp/smol.gguf: treeflash.train.evaluate on the default model, budgets 32 and auto, with folded
#            decode (the default at its size) and without -> eval_folded.json, eval_unfolded.json (<= 170 s each)
# kv         bench/kv_attention_gpu.py --sweep over the q8_0-K pairs -> kv_attention_sweep.json (<= 170 s)
# kv_split   the "split" / "split8" dequantization variants against words, 27B heads (<= 200 s) and 8B heads
#            (head_dim 128, <= 120 s) -> kv_sweep_split.json, kv_sweep_split_hd128.json
# kv_long    bench/kv_long_decode.py, the 27B shape at 128K for bf16 and four compressed pairs (<= 200 s)
# kv_rot     bench/kv_long_decode.py, the 27B shape at 128K: q8_0/q8_0 and q4_0/q4_0 with rotated keys (the default)
#            and without (:norot), twice interleaved: what the key rotation costs a decode step (<= 200 s)
# profile_rot  bench/gpu_profile.py: the 27B shape's first 8 layers (2 attention layers) at 128K, kernel by kernel,
#            q8_0/q8_0 and q4_0/q4_0 with rotated keys and without -> profile_rot_{q8,q4}_{rot,norot}.json (<= 60 s each)
# rot_fix    bench/gpu_check.py --only rotated_keys kv_write (<= 120 s), then kv_long_decode at 128K (27B shape) for
#            bf16, q8_0, q4_0 (rotated keys and not), q8_0/tq3_0 and tq3_0 (<= 200 s), and the kernel table of the
#            tq3_0/tq3_0 and q8_0/q8_0 steps (8 layers, <= 60 s each) -> check_rot.json, kv_long_rot.json, profile_*.json
# gemv_graph bench/gemv_in_graph.py: the 8B shape's q/k/v, o_proj and down GEMV configurations, each timed inside the
#            whole graphed decode step (pipelined tok/s, graph replay), the shipped set between them (<= 300 s)
# device_steps  bench/device_step_time.py, greedy and sampled steps (<= 180 s); with /tmp/smol.gguf present, the v7 evaluation with
#            device steps and without (TREEFLASH_DEVICE_STEPS=0), auto / DDTree-32 / DDTree-48 (<= 170 s each)
# cli_bench  with /tmp/smol.gguf: `treeflash bench` on the default model (chat prompts, 256 tokens, --baseline ar),
#            greedy, sampled (temperature 1) and sampled without device steps (<= 120 s each)
# cli_bisect with /tmp/smol.gguf: the sampled bench as is, then without device steps, folded norms or the Triton
#            top-k (TREEFLASH_DEVICE_STEPS / TREEFLASH_FOLDED_ROWS / TREEFLASH_DRAFT_TOPK; <= 60 s each). Written to
#            bisect stop 23's abort; its cause (a second Engine freed the folded weights) is fixed since stop 24, and
#            this stays as a regression run. bench/cli_auto_probe.py logs every decoder step of a bench run.
# Wheels in .whl/ (flash-linear-attention, fla-core, einops) are installed offline into /tmp/site
# and put on the path for the stages after check only: gpu_check compares against transformers,
# which would route its own Gated DeltaNet to fla if it could import it.
# Environment: STAGES (default "check gdn verify_ab speed"), OUT.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_session}
STAGES=${STAGES:-check gdn verify_ab speed}
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
      timeout 200 python3 bench/gpu_check.py --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1
      log "gpu_check rc=$? $(grep -E 'GPU CHECK' "$OUT/gpu_check.log" || echo 'no verdict: see gpu_check.log')" ;;
    gdn)
      log "gdn_kernels (walk, OUT_SPLIT walk, chunked form)"
      timeout 80 python3 bench/gdn_kernels_gpu.py --trees chain16 chain32 ddtree32 --variants default walk_default \
        walk_outsplit_bv32_w2 walk_outsplit_bv16_w1 walk_outsplit_bv16_w2 chunk_bv8_w4 chunk_bv16_w4 chunk_bv16_w8 chunk_bv32_w8 \
        --out "$OUT/gdn_kernels.json" > "$OUT/gdn_kernels.log" 2>&1
      log "gdn_kernels rc=$?"
      grep -E "^\[" "$OUT/gdn_kernels.log" | tee -a "$OUT/progress.log" ;;
    verify_ab)
      for v in "chunk qwen3.5-27b TREEFLASH_TREE_CHUNK=32" "normin qwen3-8b TREEFLASH_GEMV_NORM_IN=1" \
               "normin_qkv qwen3-8b TREEFLASH_GEMV_NORM_IN=qkv"; do
        set -- $v
        log "gpu_speed $2 with $3"
        env "$3" PYTHONPATH=$SITE timeout 70 python3 bench/gpu_speed.py --shapes "$2" --buckets 1,32 --prefill "" \
          --drafter-layers 0 --decode-tokens 64 --out "$OUT/ab_$1.json" > "$OUT/ab_$1.log" 2>&1
        log "rc=$?"
        grep -E "decode|nodes" "$OUT/ab_$1.log" | tee -a "$OUT/progress.log"
      done ;;
    speed)
      log "gpu_speed"
      PYTHONPATH=$SITE timeout 160 python3 bench/gpu_speed.py --shapes qwen3.5-27b,qwen3-8b --buckets 1,32 \
        --prefill 4096,32768 --drafter-layers 0 --decode-tokens 64 --out "$OUT/gpu_speed.json" > "$OUT/gpu_speed.log" 2>&1
      log "gpu_speed rc=$?"
      grep -E "copy bandwidth|decode|32 nodes|prefill" "$OUT/gpu_speed.log" | tee -a "$OUT/progress.log" ;;
    folded_ab)
      for shape in qwen3-8b smollm2-135m; do
        tag=$([ "$shape" = qwen3-8b ] && echo 8b || echo smol)
        for round in 1 2; do
          for mode in off on; do
            flag=$([ "$mode" = on ] && echo --folded-decode || echo --no-folded-decode)
            log "gpu_speed $shape folded decode $mode (round $round)"
            PYTHONPATH=$SITE timeout 60 python3 bench/gpu_speed.py --shapes "$shape" --buckets 1 --prefill "" --drafter-layers 0 \
              --decode-tokens 64 $flag --out "$OUT/folded_${mode}_${tag}_${round}.json" > "$OUT/folded_${mode}_${tag}_${round}.log" 2>&1
            log "rc=$?"
            grep -E "decode" "$OUT/folded_${mode}_${tag}_${round}.log" | head -1 | tee -a "$OUT/progress.log"
          done
        done
      done ;;
    profile_folded)
      # where the folded step's time goes against the default's: kernel by kernel, both shapes, with PDL
      # (as the model runs) and without it (TREEFLASH_PDL=0: each kernel's own duration, no wait on the one
      # before inside it) (<= 60 s each)
      for pdl in ${PROFILE_PDL:-1 0}; do
        for shape in ${PROFILE_SHAPES:-qwen3-8b smollm2-135m}; do
          for mode in ${PROFILE_MODES:-default folded}; do
            flag=$([ "$mode" = folded ] && echo --folded-decode || echo --no-folded-decode)
            tag=${mode}_${shape}$([ "$pdl" = 0 ] && echo _nopdl || true)
            log "gpu_profile $shape $mode (TREEFLASH_PDL=$pdl)"
            TREEFLASH_PDL=$pdl timeout 60 python3 bench/gpu_profile.py --shape "$shape" $flag --replays 20 \
              --out "$OUT/profile_$tag.json" > "$OUT/profile_$tag.log" 2>&1
            log "rc=$? $(grep -v -i warn "$OUT/profile_$tag.log" | grep 'kernels per step' | head -n 1)"
          done
        done
      done ;;
    eval_folded)
      # with /tmp/smol.gguf: the real default model and its shipped drafter, plain / DDTree-32 / auto, with the
      # model's default (folded decode on at this size since stop 28) and with TREEFLASH_FOLDED_DECODE=0 (<= 170 s each)
      if [ -f /tmp/smol.gguf ]; then
        for ab in "eval_folded 1" "eval_unfolded 0"; do
          set -- $ab
          log "evaluate $1 (TREEFLASH_FOLDED_DECODE=$2)"
          TREEFLASH_FOLDED_DECODE=$2 PYTHONPATH=/tmp/site:$PWD timeout 170 python3 -m treeflash.train.evaluate --target /tmp/smol.gguf \
            --drafter treeflash/assets/smollm2_dflash --device cuda --budgets 32 auto --max-tokens 256 --time-limit 130 \
            --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
          log "rc=$?"
          grep -E "^\[eval\]" "$OUT/$1.log" | tail -n 6 | tee -a "$OUT/progress.log"
        done
      else
        log "no /tmp/smol.gguf: evaluation skipped"
      fi ;;
    kv)
      log "kv_attention sweep (q8_0 K pairs)"
      PYTHONPATH=$SITE timeout 170 python3 bench/kv_attention_gpu.py --sweep --sweep-pairs q8_0/q8_0 q8_0/tq3_0 q8_0/bf16 \
        --sweep-budget-s 150 --out "$OUT/kv_attention_sweep.json" > "$OUT/kv_attention.log" 2>&1
      log "kv_attention rc=$?"
      tail -n 25 "$OUT/kv_attention.log" | tee -a "$OUT/progress.log" ;;
    kv_split)
      log "kv_attention sweep: split variants (q4_0 / tq3_0 sides), split8 (q8_0 sides too), 27B then 8B heads"
      PYTHONPATH=$SITE timeout 200 python3 bench/kv_attention_gpu.py --sweep --sweep-pairs q8_0/q8_0 q8_0/tq3_0 q8_0/q4_0 \
        q4_0/q4_0 tq3_0/tq3_0 --sweep-variants words_n32_w4 split_n32_w4 split_n64_w4 split8_n32_w4 split8_n32_w8 \
        --sweep-budget-s 180 --out "$OUT/kv_sweep_split.json" > "$OUT/kv_split.log" 2>&1
      log "kv_split 27B rc=$?"
      tail -n 14 "$OUT/kv_split.log" | tee -a "$OUT/progress.log"
      PYTHONPATH=$SITE timeout 120 python3 bench/kv_attention_gpu.py --sweep --heads 32 --kv-heads 8 --head-dim 128 \
        --sweep-pairs q8_0/q8_0 q4_0/q4_0 tq3_0/tq3_0 --sweep-variants words_n64_w8 split_n32_w4 split8_n32_w4 split8_n64_w4 \
        --sweep-budget-s 100 --out "$OUT/kv_sweep_split_hd128.json" > "$OUT/kv_split_hd128.log" 2>&1
      log "kv_split 8B heads rc=$?"
      tail -n 10 "$OUT/kv_split_hd128.log" | tee -a "$OUT/progress.log" ;;
    kv_long)
      log "kv_long_decode: 27B shape at 128K, the decode default per cache type"
      PYTHONPATH=$SITE timeout 200 python3 bench/kv_long_decode.py --shape qwen3.5-27b --contexts 131072 \
        --types bf16/bf16,q8_0/q8_0,q4_0/q4_0,q8_0/tq3_0,tq3_0/tq3_0 --decode-tokens 16 \
        --out "$OUT/kv_long_decode.json" > "$OUT/kv_long.log" 2>&1
      log "kv_long rc=$?"
      tail -n 12 "$OUT/kv_long.log" | tee -a "$OUT/progress.log" ;;
    kv_rot)
      log "kv_long_decode: 27B shape at 128K, rotated keys against unrotated"
      PYTHONPATH=$SITE timeout 200 python3 bench/kv_long_decode.py --shape qwen3.5-27b --contexts 131072 \
        --types q8_0/q8_0,q8_0/q8_0:norot,q4_0/q4_0,q4_0/q4_0:norot,q8_0/q8_0:norot,q8_0/q8_0,q4_0/q4_0:norot,q4_0/q4_0 \
        --decode-tokens 16 --out "$OUT/kv_rot.json" > "$OUT/kv_rot.log" 2>&1
      log "kv_rot rc=$?"
      tail -n 8 "$OUT/kv_rot.log" | tee -a "$OUT/progress.log" ;;
    profile_rot)
      for t in q8_0 q4_0; do
        for r in rotate-keys no-rotate-keys; do
          tag=${t%_0}_$([ "$r" = rotate-keys ] && echo rot || echo norot)
          log "gpu_profile 27B (8 layers) $t/$t at 128K --$r"
          timeout 60 python3 bench/gpu_profile.py --shape qwen3.5-27b --layers 8 --cache-type-k $t --cache-type-v $t \
            --fill 131072 --$r --replays 10 --out "$OUT/profile_rot_$tag.json" > "$OUT/profile_rot_$tag.log" 2>&1
          log "rc=$?"
          grep -v -i warn "$OUT/profile_rot_$tag.log" | head -n 12 | tee -a "$OUT/progress.log"
        done
      done ;;
    rot_fix)
      log "gpu_check --only rotated_keys kv_write"
      timeout 120 python3 bench/gpu_check.py --only rotated_keys kv_write --out "$OUT/check_rot.json" > "$OUT/check_rot.log" 2>&1
      log "rc=$? $(grep -E 'GPU CHECK' "$OUT/check_rot.log" || echo 'no verdict: see check_rot.log')"
      PYTHONPATH=$SITE timeout 200 python3 bench/kv_long_decode.py --shape qwen3.5-27b --contexts 131072 \
        --types bf16/bf16,q8_0/q8_0,q8_0/q8_0:norot,q4_0/q4_0,q4_0/q4_0:norot,q8_0/tq3_0,tq3_0/tq3_0 --decode-tokens 16 \
        --out "$OUT/kv_long_rot.json" > "$OUT/kv_long_rot.log" 2>&1
      log "kv_long rc=$?"
      tail -n 7 "$OUT/kv_long_rot.log" | tee -a "$OUT/progress.log"
      for t in tq3_0 q8_0; do
        timeout 60 python3 bench/gpu_profile.py --shape qwen3.5-27b --layers 8 --cache-type-k $t --cache-type-v $t \
          --fill 131072 --replays 10 --out "$OUT/profile_${t}_128k.json" > "$OUT/profile_${t}_128k.log" 2>&1
        log "profile $t rc=$?"
        grep -v -i warn "$OUT/profile_${t}_128k.log" | head -n 9 | tee -a "$OUT/progress.log"
      done ;;
    gemv_graph)
      log "gemv_in_graph: the 8B decode GEMVs' configurations timed inside the whole graphed step"
      timeout 300 python3 bench/gemv_in_graph.py --shape qwen3-8b --out "$OUT/gemv_in_graph_8b.json" > "$OUT/gemv_in_graph.log" 2>&1
      log "gemv_in_graph rc=$?"
      grep -v -i warn "$OUT/gemv_in_graph.log" | tail -n 24 | tee -a "$OUT/progress.log" ;;
    device_steps)
      log "device_step_time: SmolLM2-shaped graphs back to back (decode, verify-16, draft, device chain / DDTree-22 / -32 / -48)"
      PYTHONPATH=$SITE timeout 180 python3 bench/device_step_time.py --trees 22,32,48 --out "$OUT/device_step_time.json" \
        > "$OUT/device_step_time.log" 2>&1
      log "device_step_time rc=$?"
      grep -E "per replay" "$OUT/device_step_time.log" | tee -a "$OUT/progress.log"
      if [ -f /tmp/smol.gguf ]; then  # the real GGUF, carried in three parts (docs/train.md): tau and speedups
        for ab in "eval_device_steps 1" "eval_sync_steps 0"; do
          set -- $ab
          log "evaluate $1 (TREEFLASH_DEVICE_STEPS=$2)"
          TREEFLASH_DEVICE_STEPS=$2 PYTHONPATH=/tmp/site:$PWD timeout 170 python3 -m treeflash.train.evaluate --target /tmp/smol.gguf \
            --drafter treeflash/assets/smollm2_dflash --device cuda --budgets auto 32 48 --max-tokens 256 --time-limit 130 \
            --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1
          log "rc=$?"
          grep -E "^\[eval\] +[a-z]" "$OUT/$1.log" | grep -E "tau" | tee -a "$OUT/progress.log"
        done
      else
        log "no /tmp/smol.gguf: evaluation skipped"
      fi ;;
    cli_bench)
      if [ -f /tmp/smol.gguf ]; then  # the CLI as a user runs it: the default model, its 8193-slot cache
        mkdir -p /tmp/tfc && cp /tmp/smol.gguf /tmp/tfc/SmolLM2-135M-Instruct.Q4_1.gguf
        for ab in "cli_bench_greedy 0 1" "cli_bench_sampled 1 1" "cli_bench_sampled_sync 1 0"; do
          set -- $ab
          log "treeflash bench $1 (temperature $2, TREEFLASH_DEVICE_STEPS=$3)"
          TREEFLASH_CACHE=/tmp/tfc TREEFLASH_DEVICE_STEPS=$3 PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m treeflash.cli.main bench \
            --prompts chat --num-prompts 6 --runs 1 --max-tokens 256 --temperature $2 --draft dflash --baseline ar \
            --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1
          log "rc=$?"
          tail -6 "$OUT/$1.log" | tee -a "$OUT/progress.log"
        done
      else
        log "no /tmp/smol.gguf: cli_bench skipped"
      fi ;;
    cli_bisect)
      # the sampled bench that aborted in stop 23 ("probability tensor contains inf/nan"), with one suspect
      # turned off at a time: device steps, folded norms, the drafter's Triton top-k (<= 60 s each)
      if [ -f /tmp/smol.gguf ]; then
        mkdir -p /tmp/tfc && cp /tmp/smol.gguf /tmp/tfc/SmolLM2-135M-Instruct.Q4_1.gguf
        for ab in "bisect_default 1 64 triton" "bisect_sync 0 64 triton" "bisect_unfolded 1 0 triton" "bisect_torch_topk 1 64 torch"; do
          set -- $ab
          log "sampled treeflash bench $1 (TREEFLASH_DEVICE_STEPS=$2 TREEFLASH_FOLDED_ROWS=$3 TREEFLASH_DRAFT_TOPK=$4)"
          TREEFLASH_CACHE=/tmp/tfc TREEFLASH_DEVICE_STEPS=$2 TREEFLASH_FOLDED_ROWS=$3 TREEFLASH_DRAFT_TOPK=$4 \
            PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -m treeflash.cli.main bench --prompts chat --num-prompts 6 --runs 1 \
            --max-tokens 256 --temperature 1 --draft dflash --baseline ar --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1
          log "rc=$?"
          grep -v "^frame" "$OUT/$1.log" | tail -4 | tee -a "$OUT/progress.log"
        done
      else
        log "no /tmp/smol.gguf: cli_bisect skipped"
      fi ;;
    *) log "unknown stage $stage (check, gdn, verify_ab, speed, folded_ab, profile_folded, eval_folded, kv, kv_split, kv_long, device_steps, cli_bench, cli_bisect)" ;;
  esac
done
log "done"
# the device returns at most 8 files: everything but progress.log goes back as one archive
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar czf /tmp/gpu_session.tar.gz --exclude progress.log . && mv /tmp/gpu_session.tar.gz session.tar.gz \
    && find . -type f ! -name session.tar.gz ! -name progress.log -delete)
fi
