#!/usr/bin/env bash
# Trains the embedded demo on the GPU machine, in stages (tools/demo/README.md):
#
#   tools/demo/device_train.sh DATA STAGE...
#
# DATA: what tools/demo/prepare_data.py wrote (data/, tokenizer/). Stages, in the order given:
#   build   configure + build specdec-kimi into build-demo/ in the background (capture, generate
#           and dequantize use it; later stages wait for it), from $DEMO_SOURCE (default: this
#           checkout): CPU-only, or for sm_90 with CAPTURE_DEVICE=cuda
#   smoke   train_target.py for a few seconds into a scratch folder (every code path, export
#           included, before the long run)
#   target  tools/demo/train_target.py -> $OUT/target
#   parity  our engine generates from the target ($DEMO_TARGET, else $OUT/target); the
#           transformers parity fixture of it -> $OUT/hf_parity_demo.json
#   draft   specdec-kimi capture over data/prompts_train.jsonl (the target from $DEMO_TARGET, else
#           $OUT/target; CAPTURE_SHARDS CPU processes, or with CAPTURE_DEVICE=cuda one process on
#           the GPU, CAPTURE_BATCH requests at a time) -> tools/demo/train_eagle3.py -> $OUT/draft
#   eval    tools/demo/eval_accept.py: held-out prompts, plain and EAGLE-3 chain 3, greedy ->
#           $OUT/eval.json (same tokens required; accept length reported)
# Knobs (environment): TARGET_MINUTES (4), DRAFT_MINUTES (3), CAPTURE_PROMPTS (all),
# CAPTURE_NEW_TOKENS (128), CAPTURE_DEVICE (cpu | cuda), CAPTURE_SHARDS (nproc, cpu),
# CAPTURE_BATCH (64, cuda), DRAFT_SELF_TEST (1: train_eagle3.py --self-test first),
# EVAL_PROMPTS (16), EVAL_NEW_TOKENS (96).
# Logs go to $OUT/log.txt. Every stage fails loudly; nothing is skipped silently.
set -euo pipefail
DATA=${1:?usage: tools/demo/device_train.sh DATA STAGE...}
shift
OUT=${OUT:?set OUT to the output folder}
BUILD=build-demo
BIN=$BUILD/examples/specdec-kimi
WORK=${DEMO_WORK:-/tmp/demo-work}
LOGS=$WORK/logs
mkdir -p "$LOGS"
# $OUT brings back only a few files: the logs travel as one, $OUT/log.txt.
collect_logs() {
  for f in "$LOGS"/*; do
    [[ -f $f ]] && { echo "===== $(basename "$f")"; tail -n 300 "$f"; }
  done > "$OUT/log.txt"
}
trap collect_logs EXIT
TARGET=${DEMO_TARGET:-$OUT/target}
say() { echo "[$(date +%T)] $*"; }

wait_build() {
  if [[ -f $WORK/build.pid ]]; then
    local pid
    pid=$(cat "$WORK/build.pid")
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
    rm -f "$WORK/build.pid"
  fi
  if [[ ! -x $BIN ]]; then
    say "build failed: tail of $LOGS/build.log"
    tail -30 "$LOGS/build.log"
    exit 1
  fi
}

for stage in "$@"; do
  case $stage in
    build)
      say "build: CPU-only specdec-kimi in the background"
      if [[ ${CAPTURE_DEVICE:-cpu} == cuda ]]; then
        cuda_flags=(-DSPECDEC_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
      else
        cuda_flags=(-DSPECDEC_ENABLE_CUDA=OFF)
      fi
      (cmake -S "${DEMO_SOURCE:-.}" -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}" &&
         ninja -C $BUILD specdec-kimi) > "$LOGS/build.log" 2>&1 &
      echo $! > "$WORK/build.pid"
      ;;
    smoke)
      say "smoke: a few seconds of target training, then export"
      rm -rf "$WORK/smoke"
      python3 tools/demo/train_target.py --data "$DATA" --out "$WORK/smoke" --minutes 0.15 \
        2>&1 | tee "$LOGS/smoke.log"
      ;;
    target)
      say "target: training ${TARGET_MINUTES:-4} min"
      python3 tools/demo/train_target.py --data "$DATA" --out "$TARGET" \
        --minutes "${TARGET_MINUTES:-4}" 2>&1 | tee "$LOGS/train_target.log"
      ;;
    parity)
      wait_build
      prompt=$(python3 -c 'import json,sys; print(",".join(map(str, json.loads(open(sys.argv[1]).readline())["input_ids"][:48])))' \
        "$DATA/data/prompts_heldout.jsonl")
      say "target: our engine (CPU) generates"
      $BIN generate --model-path "$TARGET" --input-ids "$prompt" --max-new-tokens 64 --json \
        --ignore-eos | tee "$LOGS/generate_target.json"
      say "target: transformers parity"
      python3 scripts/hf_parity.py --specdec-kimi $BIN --checkpoint "$TARGET" --name demo \
        --input-ids "$prompt" --out "$WORK/parity" 2>&1 | tee "$LOGS/hf_parity.log"
      cp "$WORK/parity/hf_parity_demo.json" "$OUT/"
      ;;
    draft)
      wait_build
      shards=${CAPTURE_SHARDS:-$(nproc)}
      prompts=$DATA/data/prompts_train.jsonl
      if [[ -n ${CAPTURE_PROMPTS:-} ]]; then
        head -n "$CAPTURE_PROMPTS" "$prompts" > "$WORK/prompts.jsonl"
        prompts=$WORK/prompts.jsonl
      fi
      rm -rf "$WORK/capture"
      mkdir -p "$WORK/capture"
      pids=()
      if [[ ${CAPTURE_DEVICE:-cpu} == cuda ]]; then
        shards=0
        say "draft: capture over $(wc -l < "$prompts") prompts on the GPU, batch ${CAPTURE_BATCH:-64}"
        $BIN capture --model-path "$TARGET" --prompts "$prompts" --layers 0,1,2 \
          --max-new-tokens "${CAPTURE_NEW_TOKENS:-128}" --device cuda --batch "${CAPTURE_BATCH:-64}" \
          --out "$WORK/capture/part_0.safetensors" > "$LOGS/capture_0.log" 2>&1 &
        pids+=($!)
      else
        say "draft: capture over $(wc -l < "$prompts") prompts, $shards processes"
      fi
      for ((i = 0; i < shards; ++i)); do
        $BIN capture --model-path "$TARGET" --prompts "$prompts" --layers 0,1,2 \
          --max-new-tokens "${CAPTURE_NEW_TOKENS:-128}" --shard "$i/$shards" \
          --out "$WORK/capture/part_$i.safetensors" > "$LOGS/capture_$i.log" 2>&1 &
        pids+=($!)
      done
      for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { say "capture shard $i failed:"; cat "$LOGS/capture_$i.log"; exit 1; }
      done
      cat "$LOGS"/capture_*.log | tail -n "${#pids[@]}"
      say "draft: self-test, then training ${DRAFT_MINUTES:-3} min"
      if [[ ${DRAFT_SELF_TEST:-1} != 0 ]]; then
        python3 tools/demo/train_eagle3.py --self-test 2>&1 | tee "$LOGS/train_eagle3_selftest.log"
      fi
      python3 tools/demo/train_eagle3.py --capture "$WORK"/capture/part_*.safetensors \
        --target "$TARGET" --out "$OUT/draft" --minutes "${DRAFT_MINUTES:-3}" 2>&1 |
        tee "$LOGS/train_eagle3.log"
      ;;
    eval)
      wait_build
      say "eval: held-out prompts, plain against EAGLE-3 chain 3"
      python3 tools/demo/eval_accept.py --specdec-kimi $BIN --model-path "$TARGET" \
        --draft "$OUT/draft" --prompts "$DATA/data/prompts_heldout.jsonl" \
        --count "${EVAL_PROMPTS:-16}" --max-new-tokens "${EVAL_NEW_TOKENS:-96}" \
        --out "$OUT/eval.json" 2>&1 | tee "$LOGS/eval.log"
      ;;
    *)
      echo "unknown stage $stage (build, smoke, target, parity, draft, eval)" >&2
      exit 2
      ;;
  esac
done
say "done"
