#!/usr/bin/env bash
# The whole GPU run on the H200 machine, in one call: configure for sm_90 with ninja, build,
# run every test (GPU tests included) and the op benchmarks, and write logs plus a short results
# table under $OUT (default ./device-out). Stages are bounded so the call ends inside its limit.
#   scripts/device_run.sh [tests|bench|all] [benchmark family regex, e.g. 'copy|verify']
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
filter=${2:-.}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
build=build-h200
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv; nproc; } > "$OUT/gpu.txt" 2>&1
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_FLAGS="-Xptxas -v" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
if ! timeout 400 cmake --build $build -j "$(nproc)" > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1
fi
grep -E "spill|stack frame" "$OUT/build.log" | grep -v " 0 bytes spill" | sort | uniq -c | head -20 > "$OUT/ptxas_spills.txt"
status=0
if [ "$what" != bench ]; then
  timeout 300 ctest --test-dir $build --output-on-failure -j 4 > "$OUT/ctest.log" 2>&1 || status=1
  tail -25 "$OUT/ctest.log"
fi
if [ "$what" != tests ]; then
  # One family at a time, each bounded, so a slow family cannot cost the others their numbers.
  families=$($build/benchmarks/specdec_bench_ops --benchmark_list_tests | sed 's|/.*||' | sort -u |
             grep -E "$filter")
  for family in $families; do
    timeout "${SPECDEC_BENCH_SECONDS:-50}" $build/benchmarks/specdec_bench_ops \
      --benchmark_filter="^$family/" --benchmark_out="$OUT/$family.json" \
      --benchmark_out_format=json > "$OUT/$family.txt" 2>&1 || { echo "$family: exit $?"; status=1; }
  done
  python3 scripts/bench_table.py "$OUT"/BM_*.json > "$OUT/results.md" 2>&1 || status=1
  cat "$OUT/results.md"
fi
exit $status
