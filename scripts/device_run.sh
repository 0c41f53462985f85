#!/usr/bin/env bash
# The whole GPU run on the H200 machine, in one call: configure for sm_90 with ninja, build (with
# ptxas's resource report), run every test (GPU tests included), the transformers parity fixture
# the op benchmarks and the engine benchmark. Logs go to a scratch folder; $OUT (default ./device-out) receives only
# results.md (the short table), summary.txt, the parity fixtures and logs.tar.gz, since a call
# brings back few files.
#   scripts/device_run.sh [all|tests|parity|bench|engine|tp|kimi|kimi1gpu|step|profile|ops]...
#                         [--bench-filter REGEX]
# ops (not in all): builds the CUDA tests and the op benchmarks alone, runs the GPU tests
# (ctest -L gpu; SPECDEC_CTEST_REGEX narrows them) and the op benchmarks (--bench-filter). SPECDEC_NCU="BENCH_FILTER::KERNEL_REGEX"
# adds Nsight Compute (--clock-control none) on the first launch of the kernels matching
# KERNEL_REGEX in the benchmarks matching BENCH_FILTER (ncu.txt in the logs, its headline figures
# in the summary; SPECDEC_NCU_EXTRA adds ncu arguments, e.g. --metrics for stall reasons;
# SPECDEC_NCU_COUNT profiles that many matching launches, default 1);
# SPECDEC_SASS=REGEX counts the SASS opcodes of the kernels whose names match.
# engine: specdec_bench_engine (the engine end to end on the tiny repeating and random targets,
# CPU and CUDA executors: NONE against n-gram chains, speedup measured in the same process).
# tp: the tiny preset (INT4 experts) through `specdec-kimi generate --device cuda` at --tp-size 1
# and at the number of visible GPUs (NCCL in one process, and with 2+ GPUs also as one process per
# GPU through --nnodes / --node-rank / --dist-init-addr on 127.0.0.1), plainly and with an EAGLE-3
# tree: the greedy tokens must be the same; tokens/s of each.
# kimi (not in all): writes the kimi-k2.5 preset with $SPECDEC_KIMI_LAYERS (default 2) layers and
# INT4 experts at real dimensions (14.4 GB for 2 layers, ~270 s) whose greedy text repeats with
# period 16 (--repeat-period: the same tensors and cost, residual writers zero) and generates 32
# tokens on the CUDA engine from a prompt holding one period, plainly (NONE) and with an n-gram
# chain of 4: tokens/s, accept length and the time per verify of each phase (their ratio: the
# accept length at which a chain of 4 pays on this model); with 2+ GPUs visible, both again at
# --tp-size = the GPU count (tokens compared with one GPU's).
# step (not in all): specdec_bench_kimi_step, one forward step of the kimi-k2.5-1gpu preset (real
# dimensions, 61 layers, 64 INT4 experts per layer: ~118 GB drawn on the GPU, one H200) at
# --context 1024: decode at batch 1 / 8 / 32 and verify of chains and trees, each beside its floor
# (bytes it must read / the copy bandwidth measured in the same run), with projected speedups;
# then the speculative step through SpecEngine (a random Kimi-size EAGLE-3 draft, chain of 3,
# against plain decoding, 32 tokens after a 1024-token prompt: each phase beside its floor); its
# markdown tables go to the summary, its JSON to $OUT/kimi_step.json.
# kimi1gpu (not in all): the kimi-k2.5-1gpu preset whole (init-random --config-only; generate
# --random-weights draws its 118 GB on the GPU) with a random Kimi-size EAGLE-3 draft (layers
# 1,29,57, draft vocabulary 32000, ~2 GB written): 32 tokens plainly and with an EAGLE-3 chain of
# 3 (4 nodes), the latter twice: with the device-resident step and with --disable-device-step
# (the proposal read back: what the second host wait costs); per verify the time of each phase,
# and one speculative step over the plain step (scripts/verify_split.py: the accept length from
# which the chain pays on this model).
# demo (not in all): tools/demo/eval_accept.py on the embedded demo (models/demo) with --device
# cuda: 16 held-out prompts (models/demo/eval_prompts.jsonl), plain and EAGLE-3 chain 3, greedy;
# same tokens required; accept length and both decode rates -> $OUT/demo_eval_cuda.json; then
# specdec-kimi bench --device cuda --batch 1,4 (the drafting plan across them) ->
# $OUT/demo_bench_cuda.json and $OUT/demo_bench_cuda_b{1,4}.png.
# profile (not in all): Nsight Compute over one eager decode at batch 1 of the step's model
# (specdec_bench_kimi_step --profile-decode 1): every kernel of the forward timed alone
# (gpu__time_duration, clocks and caches as they run), grouped by kernel and grid by
# scripts/kernel_profile.py into $OUT/profile_decode.md (per MoE layer: / 60).
# kimi, kimi1gpu, step, profile and demo alone (in any mix) build only their binaries.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on the shared multi-GPU hosts (the machines set it; so does this).
export NCCL_NVLS_ENABLE=0
stages=() filter=.
while [ $# -gt 0 ]; do
  case $1 in
    --bench-filter) filter=$2; shift 2 ;;
    all) stages+=(tests parity bench engine tp); shift ;;
    tests|parity|bench|engine|tp|kimi|kimi1gpu|step|profile|demo|ops) stages+=("$1"); shift ;;
    *) echo "device_run.sh: unknown argument '$1' (stages: all tests parity bench engine tp kimi kimi1gpu step profile demo ops; --bench-filter REGEX)" >&2; exit 2 ;;
  esac
done
[ ${#stages[@]} -eq 0 ] && stages=(tests parity bench engine)
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }
# Only kimi / step stages: build their binaries alone.
only_targets=()
for stage in "${stages[@]}"; do
  case $stage in
    kimi|kimi1gpu|demo) only_targets+=(specdec-kimi) ;;
    step|profile) only_targets+=(specdec_bench_kimi_step) ;;
    ops) only_targets+=(specdec_cuda_tests specdec_bench_ops) ;;
    *) only_targets=(); break ;;
  esac
done
[ ${#only_targets[@]} -gt 0 ] && only_targets=(--target $(printf "%s\n" "${only_targets[@]}" | sort -u))
OUT=${OUT:-$PWD/device-out}
logs=$(mktemp -d)
mkdir -p "$OUT"
build=build-h200
summary="$OUT/summary.txt"
finish() {
  tar czf "$OUT/logs.tar.gz" -C "$logs" . 2>/dev/null
  cat "$summary"
}
trap finish EXIT
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv; nproc; } > "$logs/gpu.txt" 2>&1
cat "$logs/gpu.txt" > "$summary"
start=$SECONDS
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_FLAGS="-Xptxas -v" > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log" >> "$summary"; exit 1; }
if ! timeout "${SPECDEC_BUILD_SECONDS:-420}" cmake --build $build -j "$(nproc)" "${only_targets[@]}" > "$logs/build.log" 2>&1; then
  { echo "BUILD FAILED"; grep -E "error|Error" -A3 "$logs/build.log" | head -60; } >> "$summary"; exit 1
fi
echo "build: $((SECONDS - start)) s" >> "$summary"
{ echo "ptxas spills / stack frames (non-zero):"
  grep -E "spill|stack frame" "$logs/build.log" | grep -v " 0 bytes spill" | grep -v "0 bytes stack frame" | sort | uniq -c | head -20; } >> "$summary"
status=0
if wants tests || wants ops; then
  labels=()
  wants tests || labels=(-L gpu)
  [ -n "${SPECDEC_CTEST_REGEX:-}" ] && labels+=(-R "$SPECDEC_CTEST_REGEX")
  timeout 300 ctest --test-dir $build --output-on-failure -j 4 "${labels[@]}" > "$logs/ctest.log" 2>&1 || status=1
  { echo "--- ctest"; grep -E "Test +#|tests passed|Failed|\*\*\*" "$logs/ctest.log" | grep -v " Passed " | tail -30;
    grep -E "tests passed" "$logs/ctest.log"; } >> "$summary"
fi
if wants parity; then
  for mode in bf16 int4; do
    flag=; suffix=
    [ $mode = int4 ] && flag=--int4 suffix=_int4
    rm -rf "$logs/parity$suffix"
    if timeout 240 python3 scripts/hf_parity.py --specdec-kimi $build/examples/specdec-kimi $flag \
         --out "$logs/parity$suffix" > "$logs/parity$suffix.log" 2>&1; then
      cp "$logs/parity$suffix/hf_parity_fixture$suffix.json" "$OUT/"
      echo "--- parity ($mode): fixture written" >> "$summary"
      grep "specdec cuda vs" "$logs/parity$suffix.log" >> "$summary"
    else
      { echo "--- parity ($mode) FAILED"; tail -20 "$logs/parity$suffix.log"; } >> "$summary"; status=1
    fi
  done
fi
if wants kimi; then
  layers=${SPECDEC_KIMI_LAYERS:-2}
  dir=$(mktemp -d)/kimi
  t0=$SECONDS
  gen=($build/examples/specdec-kimi generate --model-path "$dir" --device cuda --json --ignore-eos
       --max-new-tokens 32 --input-ids 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,0,1,2,3)
  ngpu=$(nvidia-smi -L | wc -l)
  ngram=(--speculative-algorithm NGRAM --speculative-num-steps 4 --speculative-eagle-topk 1
         --speculative-num-draft-tokens 5)
  if $build/examples/specdec-kimi init-random --preset kimi-k2.5 --num-layers "$layers" --int4 \
       --repeat-period 16 --out "$dir" > "$logs/kimi.log" 2>&1 &&
     echo "--- kimi-k2.5, $layers layers, INT4 experts: written in $((SECONDS - t0)) s" >> "$summary" &&
     "${gen[@]}" > "$logs/kimi.json" 2>> "$logs/kimi.log" &&
     "${gen[@]}" "${ngram[@]}" > "$logs/kimi_ngram.json" 2>> "$logs/kimi.log" &&
     { [ "$ngpu" -lt 2 ] ||
       { "${gen[@]}" --tp-size "$ngpu" > "$logs/kimi_tp.json" 2>> "$logs/kimi.log" &&
         "${gen[@]}" "${ngram[@]}" --tp-size "$ngpu" > "$logs/kimi_tp_ngram.json" 2>> "$logs/kimi.log"; }; }; then
    # Per verify: the step time with 1 node (NONE) and with 5 (n-gram chain of 4); their ratio is
    # the accept length at which a chain of 4 breaks even on this model.
    python3 scripts/verify_split.py "$logs"/kimi*.json >> "$summary"
  else
    { echo "--- kimi FAILED"; tail -5 "$logs/kimi.log"; } >> "$summary"; status=1
  fi
  rm -rf "$dir"
fi
if wants demo; then
  # The embedded demo on the CUDA executor: held-out prompts, plain and EAGLE-3 chain 3, greedy.
  if timeout 240 python3 tools/demo/eval_accept.py --specdec-kimi $build/examples/specdec-kimi \
       --model-path models/demo/target --draft models/demo/draft \
       --prompts models/demo/eval_prompts.jsonl --count 16 --max-new-tokens 96 --device cuda \
       --out "$OUT/demo_eval_cuda.json" > "$logs/demo.log" 2>&1; then
    { echo "--- demo (cuda)"; grep -v "^prompt" "$logs/demo.log"; } >> "$summary"
  else
    { echo "--- demo FAILED"; tail -20 "$logs/demo.log"; } >> "$summary"; status=1
  fi
  # The device-resident step against the proposal read back (--disable-device-step) on the
  # first held-out prompt, 256 tokens, alternating 3 times, with plain decoding beside them:
  # per-verify phase times and each step over the plain step.
  ids=$(head -1 models/demo/eval_prompts.jsonl | python3 -c \
        "import json,sys; print(','.join(map(str, json.load(sys.stdin)['input_ids'])))")
  demo_gen=($build/examples/specdec-kimi generate --model-path models/demo/target --device cuda
            --json --ignore-eos --no-self-check --max-new-tokens 256 --input-ids "$ids")
  demo_eagle=(--speculative-algorithm EAGLE3 --speculative-draft-model-path models/demo/draft
              --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
  steps_ok=1
  for i in 1 2 3; do
    "${demo_gen[@]}" > "$logs/demo_step_none_$i.json" 2>> "$logs/demo_step.log" &&
      "${demo_gen[@]}" "${demo_eagle[@]}" > "$logs/demo_step_device_$i.json" \
        2>> "$logs/demo_step.log" &&
      "${demo_gen[@]}" "${demo_eagle[@]}" --disable-device-step \
        > "$logs/demo_step_readback_$i.json" 2>> "$logs/demo_step.log" || steps_ok=0
  done
  if [ $steps_ok = 1 ]; then
    { echo "--- demo step: device-resident vs read back (3 runs each)"
      python3 scripts/verify_split.py "$logs"/demo_step_*.json; } >> "$summary"
  else
    { echo "--- demo step FAILED"; tail -5 "$logs/demo_step.log"; } >> "$summary"; status=1
  fi
  # The sweep (specdec-kimi bench) at batch 1 and 4 on the GPU in one run, with the drafting
  # plan across them and a plot per batch size.
  if timeout 400 $build/examples/specdec-kimi bench --device cuda --batch 1,4 \
       --json "$OUT/demo_bench_cuda.json" > "$logs/demo_bench.md" 2>&1; then
    { echo "--- demo bench (cuda, batch 1 and 4)"; cat "$logs/demo_bench.md"; } >> "$summary"
    for batch in 1 4; do
      python3 tools/bench_plot.py "$OUT/demo_bench_cuda.json" --batch $batch \
        --out "$OUT/demo_bench_cuda_b$batch.png" >> "$summary" 2>&1
    done
  else
    { echo "--- demo bench FAILED"; tail -20 "$logs/demo_bench.md"; } >> "$summary"; status=1
  fi
fi
if wants step; then
  if timeout "${SPECDEC_STEP_SECONDS:-400}" $build/benchmarks/specdec_bench_kimi_step \
       --json "$logs/kimi_step.json" --markdown "$logs/kimi_step.md" > "$logs/kimi_step.txt" 2>&1; then
    { echo "--- step"; grep -E "^(copy floor|weights|KV cache|GPU memory):" "$logs/kimi_step.txt";
      cat "$logs/kimi_step.md"; } >> "$summary"
    cp "$logs/kimi_step.json" "$OUT/"
  else
    { echo "--- step FAILED ($?)"; tail -20 "$logs/kimi_step.txt"; } >> "$summary"; status=1
  fi
fi
if wants profile; then
  if timeout 400 ncu --profile-from-start off --clock-control none --cache-control none \
       --metrics gpu__time_duration.sum --csv --print-units base \
       $build/benchmarks/specdec_bench_kimi_step --profile-decode 1 --spec-tokens 0 --reps 1 \
       > "$logs/profile.csv" 2> "$logs/profile.err" &&
     python3 scripts/kernel_profile.py "$logs/profile.csv" --layers 60 \
       --title "One eager decode at batch 1, kimi-k2.5-1gpu, context 1024 (ncu)" \
       > "$OUT/profile_decode.md"; then
    { echo "--- profile"; cat "$OUT/profile_decode.md"; } >> "$summary"
  else
    { echo "--- profile FAILED"; tail -20 "$logs/profile.err"; tail -5 "$logs/profile.csv"; } >> "$summary"
    status=1
  fi
fi
if wants kimi1gpu; then
  # kimi-k2.5-1gpu whole: its config alone on disk, the 118 GB of weights drawn on the GPU.
  dir=$(mktemp -d)
  kimi=$build/examples/specdec-kimi
  gen=($kimi generate --model-path "$dir/t" --random-weights 1 --device cuda --json --ignore-eos
       --no-self-check --max-new-tokens 32 --input-ids 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15)
  eagle=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$dir/d"
         --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
  t0=$SECONDS
  if $kimi init-random --preset kimi-k2.5-1gpu --int4 --config-only --out "$dir/t" \
       --draft eagle3 --layers 1,29,57 --draft-vocab 32000 --draft-out "$dir/d" > "$logs/kimi1gpu.log" 2>&1 &&
     echo "--- kimi-k2.5-1gpu (61 layers, 64 INT4 experts, weights on the GPU); draft written in $((SECONDS - t0)) s" >> "$summary" &&
     "${gen[@]}" > "$logs/kimi1gpu.json" 2>> "$logs/kimi1gpu.log" &&
     "${gen[@]}" "${eagle[@]}" > "$logs/kimi1gpu_eagle3.json" 2>> "$logs/kimi1gpu.log" &&
     "${gen[@]}" "${eagle[@]}" --disable-device-step > "$logs/kimi1gpu_eagle3_host.json" \
       2>> "$logs/kimi1gpu.log"; then
    python3 scripts/verify_split.py "$logs"/kimi1gpu*.json >> "$summary"
  else
    { echo "--- kimi1gpu FAILED"; tail -5 "$logs/kimi1gpu.log"; } >> "$summary"; status=1
  fi
  rm -rf "$dir"
fi
if wants tp; then
  ngpu=$(nvidia-smi -L | wc -l)
  dir=$(mktemp -d)
  kimi=$build/examples/specdec-kimi
  echo "--- tp (GPUs visible: $ngpu)" >> "$summary"
  if $kimi init-random --preset tiny --int4 --seed 3 --out "$dir/t" --draft eagle3 --layers 0,1,2 \
       --draft-out "$dir/d" > "$logs/tp.log" 2>&1; then
    for tp in $(printf "%s\n" 1 "$ngpu" | sort -un); do
      for spec in NONE EAGLE3; do
        flags=()
        [ $spec = EAGLE3 ] && flags=(--speculative-algorithm EAGLE3 --speculative-draft-model-path
          "$dir/d" --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8)
        timeout 120 $kimi generate --model-path "$dir/t" --device cuda --json --ignore-eos \
          --max-new-tokens 64 --input-ids 5,6,7,8,9,10,11,12 --tp-size "$tp" "${flags[@]}" \
          > "$logs/tp_${tp}_$spec.json" 2>> "$logs/tp.log" || { echo "tp $tp $spec FAILED" >> "$summary"; status=1; }
      done
    done
    if [ "$ngpu" -ge 2 ]; then  # one process per GPU, rendezvous over TCP
      for node in $(seq $((ngpu - 1)) -1 0); do
        CUDA_VISIBLE_DEVICES=$node timeout 120 $kimi generate --model-path "$dir/t" --device cuda \
          --json --ignore-eos --max-new-tokens 64 --input-ids 5,6,7,8,9,10,11,12 --tp-size "$ngpu" \
          --nnodes "$ngpu" --node-rank "$node" --dist-init-addr 127.0.0.1:29517 \
          > "$logs/mp_$node.json" 2>> "$logs/tp.log" &
      done
      wait
      cp "$logs/mp_0.json" "$logs/tp_${ngpu}_NNODES.json"
    fi
    python3 - "$logs" >> "$summary" <<'PY' || status=1
import glob, json, os, sys
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "tp_*.json"))):
    tp, spec = os.path.basename(path)[3:-5].split("_")
    try:
        runs[(int(tp), spec)] = json.load(open(path))
    except ValueError:
        print("tp", tp, spec, "gave no JSON")
bad = 0
for (tp, spec), j in sorted(runs.items()):
    ref = runs.get((1, "NONE"))
    same = ref is not None and j["output_ids"] == ref["output_ids"]
    bad += not same
    print("tp %d %-6s | same tokens as tp 1 NONE: %s | decode tokens/s %.1f | accept length %.3f"
          % (tp, spec, same, j["decode_tokens_per_s"], j["accept_length"]))
sys.exit(1 if bad else 0)
PY
  else
    { echo "tp: init-random FAILED"; tail -5 "$logs/tp.log"; } >> "$summary"; status=1
  fi
  rm -rf "$dir"
fi
if wants engine; then
  if timeout "${SPECDEC_BENCH_SECONDS:-120}" $build/benchmarks/specdec_bench_engine \
       --benchmark_out="$logs/engine.json" --benchmark_out_format=json > "$logs/engine.txt" 2>&1; then
    { echo "--- engine"; grep "^BM_" "$logs/engine.txt"; } >> "$summary"
  else
    { echo "--- engine FAILED ($?)"; tail -5 "$logs/engine.txt"; } >> "$summary"; status=1
  fi
fi
if wants bench || wants ops; then
  # One family at a time, each bounded, so a slow family cannot cost the others their numbers.
  families=$($build/benchmarks/specdec_bench_ops --benchmark_list_tests | sed 's|/.*||' | sort -u |
             grep -E "$filter")
  for family in $families; do
    timeout "${SPECDEC_BENCH_SECONDS:-60}" $build/benchmarks/specdec_bench_ops \
      --benchmark_filter="^$family/" \
      --benchmark_out="$logs/$family.json" --benchmark_out_format=json > "$logs/$family.txt" 2>&1 ||
      { echo "$family: exit $?" >> "$summary"; status=1; }
  done
  python3 scripts/bench_table.py "$logs"/BM_*.json > "$OUT/results.md" 2>&1 || status=1
  echo "--- bench: results.md written" >> "$summary"
fi
if wants ops && [ -n "${SPECDEC_SASS:-}" ]; then
  cuobjdump --dump-sass $build/benchmarks/specdec_bench_ops > "$logs/sass.txt" 2>&1
  { echo "--- SASS opcodes of kernels matching '$SPECDEC_SASS'"
    awk -v re="$SPECDEC_SASS" '/Function : /{f = ($0 ~ re)} f && /\/\*[0-9a-f]+\*\//{for (i = 2; i <= NF; ++i) if ($i !~ /^@/) {print $i; break}}' \
      "$logs/sass.txt" | sed 's/;//' | sort | uniq -c | sort -rn | head -40; } >> "$summary"
  rm -f "$logs/sass.txt"
fi
if wants ops && [ -n "${SPECDEC_NCU:-}" ]; then
  ncu_bench=${SPECDEC_NCU%%::*} ncu_kernel=${SPECDEC_NCU##*::}
  timeout 240 ncu --clock-control none --kernel-name "regex:$ncu_kernel" \
    --launch-count "${SPECDEC_NCU_COUNT:-1}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats ${SPECDEC_NCU_EXTRA:-} $build/benchmarks/specdec_bench_ops \
    --benchmark_filter="$ncu_bench" > "$logs/ncu.txt" 2>&1 || echo "ncu: exit $?" >> "$summary"
  { echo "--- ncu ($SPECDEC_NCU)"
    grep -E "^  [a-z_]+.*\(|Duration|Elapsed Cycles|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Stall|stalled|pipe_|Ipc|Busy|Issued Warp|No Eligible|Cluster" \
      "$logs/ncu.txt" | head -120; } >> "$summary"
fi
echo "exit status $status, $((SECONDS - start)) s" >> "$summary"
exit $status
