#!/usr/bin/env bash
# Trains the embedded demo on the GPU machine, in stages (tools/demo/README.md):
#
#   tools/demo/device_train.sh DATA STAGE...
#
# DATA: what tools/demo/prepare_data.py wrote (data/, tokenizer/). Stages, in the order given:
#   build   configure + build specdec-kimi into build-demo/ in the background (capture, generate
#           and dequantize use it; later stages wait for it), from $DEMO_SOURCE (default: this
#           checkout): CPU-only, or for sm_90 with CAPTURE_DEVICE=cuda. Not needed when DEMO_BIN
#           names a specdec-kimi built elsewhere (for sm_90, when capturing on the GPU)
#   smoke   train_target.py for a few seconds into a scratch folder (every code path, export
#           included, before the long run)
#   target  tools/demo/train_target.py -> $OUT/target
#   parity  our engine generates from the target ($DEMO_TARGET, else $OUT/target); the
#           transformers parity fixture of it -> $OUT/hf_parity_demo.json
#   capture specdec-kimi capture over data/prompts_SET.jsonl for each SET of CAPTURE_PROMPT_SETS
#           (the target from $DEMO_TARGET, else $OUT/target) in CAPTURE_SHARDS processes: on the
#           CPU, or with CAPTURE_DEVICE=cuda on the GPU, each CAPTURE_BATCH requests at a time;
#           shard i continues its prompts at the i-th of CAPTURE_TEMPERATURES in turn (0:
#           greedy; sampled, seed i) -> $DEMO_WORK/capture/
#   draft   tools/demo/train_eagle3.py on those captures (DRAFT_ARGS: extra flags) -> $DRAFT_OUT
#   eval    tools/demo/eval_accept.py on EVAL_DEVICE: held-out prompts, plain and EAGLE-3 chain
#           3, greedy, the draft in $DRAFT_OUT -> $EVAL_OUT (same tokens required; accept
#           length reported)
#   drafts  the draft stage for each of DRAFT_VARIANTS ("name:flags|name:flags...", all at once
#           on the GPU, DRAFT_MINUTES each), then eval of each; the one with the highest accept
#           length (outputs equal to plain decoding's) -> $OUT/draft (config.json and
#           model.safetensors), every variant's training report and eval -> $OUT/drafts.json
# Knobs (environment): TARGET_MINUTES (4), TARGET_ARGS (extra train_target.py flags, e.g.
# "--extra-ids DATA/data/extra_train_ids.bin"), DRAFT_MINUTES (3), CAPTURE_PROMPT_SETS ("train";
# "train unseen" adds prepare_data.py --unseen-dir's prompts), CAPTURE_PROMPTS (all, per set),
# CAPTURE_NEW_TOKENS (128), CAPTURE_DEVICE (cpu | cuda), CAPTURE_SHARDS (nproc on the CPU, 1 on
# the GPU), CAPTURE_BATCH (64, cuda), CAPTURE_TEMPERATURES ("0"),
# DRAFT_SELF_TEST (1: train_eagle3.py --self-test first),
# DRAFT_ARGS, DRAFT_OUT ($OUT/draft), EVAL_PROMPTS (16), EVAL_NEW_TOKENS (96), EVAL_DEVICE (cpu),
# EVAL_OUT ($OUT/eval.json), DEMO_BIN (a prebuilt specdec-kimi). Several `draft` runs with
# different DRAFT_OUT may run at once on one GPU.
# Logs go to $OUT/log.txt. Every stage fails loudly; nothing is skipped silently.
set -euo pipefail
DATA=${1:?usage: tools/demo/device_train.sh DATA STAGE...}
shift
OUT=${OUT:?set OUT to the output folder}
BUILD=build-demo
BIN=${DEMO_BIN:-$BUILD/examples/specdec-kimi}
DRAFT_OUT=${DRAFT_OUT:-$OUT/draft}
EVAL_OUT=${EVAL_OUT:-$OUT/eval.json}
WORK=${DEMO_WORK:-/tmp/demo-work}
LOGS=$WORK/logs
mkdir -p "$LOGS" "$OUT"
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
      if [[ ${CAPTURE_DEVICE:-cpu} == cuda ]]; then
        say "build: specdec-kimi for sm_90 in the background"
        cuda_flags=(-DSPECDEC_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
      else
        say "build: CPU-only specdec-kimi in the background"
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
        --minutes "${TARGET_MINUTES:-4}" ${TARGET_ARGS:-} 2>&1 | tee "$LOGS/train_target.log"
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
    capture)
      wait_build
      prompts=$WORK/prompts.jsonl
      : > "$prompts"
      for set in ${CAPTURE_PROMPT_SETS:-train}; do
        file=$DATA/data/prompts_$set.jsonl
        [[ -f $file ]] || { say "capture: no $file (prepare_data.py --unseen-dir writes" \
                                "prompts_unseen.jsonl)"; exit 1; }
        head -n "${CAPTURE_PROMPTS:--0}" "$file" >> "$prompts"
      done
      device=${CAPTURE_DEVICE:-cpu}
      if [[ $device == cuda ]]; then
        shards=${CAPTURE_SHARDS:-1}
        per_process=(--device cuda --batch "${CAPTURE_BATCH:-64}")
      else
        shards=${CAPTURE_SHARDS:-$(nproc)}
        per_process=()
      fi
      rm -rf "$WORK/capture"
      mkdir -p "$WORK/capture"
      read -r -a temperatures <<< "${CAPTURE_TEMPERATURES:-0}"
      say "capture: $(wc -l < "$prompts") prompts, $shards processes on the $device," \
        "temperatures ${temperatures[*]} in turn"
      pids=()
      for ((i = 0; i < shards; ++i)); do
        $BIN capture --model-path "$TARGET" --prompts "$prompts" --layers 0,1,2 \
          --max-new-tokens "${CAPTURE_NEW_TOKENS:-128}" --shard "$i/$shards" "${per_process[@]}" \
          --temperature "${temperatures[i % ${#temperatures[@]}]}" --seed "$i" \
          --out "$WORK/capture/part_$i.safetensors" > "$LOGS/capture_$i.log" 2>&1 &
        pids+=($!)
      done
      for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { say "capture shard $i failed:"; cat "$LOGS/capture_$i.log"; exit 1; }
      done
      cat "$LOGS"/capture_*.log | tail -n "${#pids[@]}"
      ;;
    draft)
      ls "$WORK"/capture/part_*.safetensors > /dev/null ||
        { say "draft: no captures in $WORK/capture: run the capture stage first"; exit 1; }
      name=$(basename "$DRAFT_OUT")
      if [[ ${DRAFT_SELF_TEST:-1} != 0 ]]; then
        python3 tools/demo/train_eagle3.py --self-test 2>&1 | tee "$LOGS/train_eagle3_selftest.log"
      fi
      say "draft: training $name ${DRAFT_MINUTES:-3} min ${DRAFT_ARGS:-}"
      # shellcheck disable=SC2086 # DRAFT_ARGS is a list of flags
      python3 tools/demo/train_eagle3.py --capture "$WORK"/capture/part_*.safetensors \
        --target "$TARGET" --out "$DRAFT_OUT" --minutes "${DRAFT_MINUTES:-3}" ${DRAFT_ARGS:-} \
        > "$LOGS/train_eagle3_$name.log" 2>&1 ||
        { say "draft $name failed:"; tail -20 "$LOGS/train_eagle3_$name.log"; exit 1; }
      tail -3 "$LOGS/train_eagle3_$name.log"
      ;;
    eval)
      wait_build
      name=$(basename "$DRAFT_OUT")
      say "eval: held-out prompts, plain against EAGLE-3 chain 3 with $name"
      python3 tools/demo/eval_accept.py --specdec-kimi "$BIN" --model-path "$TARGET" \
        --draft "$DRAFT_OUT" --prompts "$DATA/data/prompts_heldout.jsonl" \
        --count "${EVAL_PROMPTS:-16}" --max-new-tokens "${EVAL_NEW_TOKENS:-96}" \
        --device "${EVAL_DEVICE:-cpu}" --out "$EVAL_OUT" 2>&1 | tee "$LOGS/eval_$name.log"
      ;;
    drafts)
      IFS='|' read -r -a variants <<< "${DRAFT_VARIANTS:?drafts: set DRAFT_VARIANTS}"
      names=() pids=()
      for v in "${variants[@]}"; do
        name=${v%%:*}
        [[ $name =~ ^[A-Za-z0-9_-]+$ && $v == *:* ]] ||
          { say "drafts: '$v' is not name:flags (name of letters, digits, _ and -)"; exit 1; }
        names+=("$name")
        DRAFT_OUT=$WORK/drafts/$name DRAFT_ARGS=${v#*:} "$0" "$DATA" draft &
        pids+=($!)
      done
      for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { say "drafts: ${names[$i]} failed"; exit 1; }
      done
      for name in "${names[@]}"; do
        DRAFT_OUT=$WORK/drafts/$name EVAL_OUT=$WORK/drafts/eval_$name.json "$0" "$DATA" eval ||
          say "drafts: the eval of $name failed (its outputs differ, or it did not run)"
      done
      python3 - "$WORK/drafts" "$OUT" "${names[@]}" <<'PY'
import json, os, shutil, sys
work, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {}
for n in names:
    r = {}
    for f, k in ((f"{work}/{n}/train_report.json", "train"), (f"{work}/eval_{n}.json", "eval")):
        if os.path.exists(f):
            r[k] = json.load(open(f))
    res[n] = r
json.dump(res, open(f"{out}/drafts.json", "w"), indent=1)
ok = [n for n in names if res[n].get("eval", {}).get("mismatches", 1) == 0]
for n in names:
    print(f"drafts: {n}: accept length {res[n].get('eval', {}).get('accept_length')}")
if not ok:
    sys.exit("drafts: no variant's outputs equal plain decoding's")
best = max(ok, key=lambda n: res[n]["eval"]["accept_length"])
os.makedirs(f"{out}/draft", exist_ok=True)
for f in ("config.json", "model.safetensors"):  # the report is in drafts.json
    shutil.copy(f"{work}/{best}/{f}", f"{out}/draft/{f}")
print(f"drafts: best {best} -> {out}/draft")
PY
      ;;
    *)
      echo "unknown stage $stage (build, smoke, target, parity, capture, draft, eval, drafts)" >&2
      exit 2
      ;;
  esac
done
say "done"
