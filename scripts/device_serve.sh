#!/usr/bin/env bash
# `specdec-kimi serve --device cuda` on the H200 machine, which has neither cpp-httplib nor PCRE2:
# run scripts/carry_serve_deps.sh here first and `carry` .carry/serve-deps. Configures for sm_90
# into build-h200-serve, builds specdec-kimi alone, writes the tiny preset whose greedy text
# repeats (period 16), and runs scripts/bench_serving.py on the GPU: plain decoding against an
# n-gram chain (NGRAM 4/1/5) at concurrency 1, 4, 16, greedy outputs compared (lossless). Results
# (the table, bench JSON, logs) go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
deps=$PWD/.carry/serve-deps
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
[ -d "$deps" ] || { echo "device_serve.sh: $deps is missing (scripts/carry_serve_deps.sh, then carry it)" >&2; exit 2; }
export PKG_CONFIG_PATH=$deps/lib/pkgconfig PCRE2_ROOT=$deps LD_LIBRARY_PATH=$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
build=build-h200-serve
t0=$SECONDS
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DSPECDEC_BUILD_TESTS=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF > "$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
grep -E "specdec-kimi serve|PCRE2" "$OUT/configure.log"
cmake --build $build --target specdec-kimi > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
kimi=$build/examples/specdec-kimi
model=$(mktemp -d)/tiny
$kimi init-random --preset tiny --out "$model" --seed 3 --repeat-period 16 > /dev/null || exit 1
python3 scripts/bench_serving.py --binary "$kimi" --model-path "$model" --device cuda \
  --speculative "NGRAM 4/1/5" --concurrency 1,4,16 --requests-per-level ${SPECDEC_SERVE_REQUESTS:-64} \
  --max-tokens 64 --prompt-len 32 --seed 0 --check-ids --json "$OUT/bench_serving.json" \
  2>&1 | tee "$OUT/bench_serving.txt"
status=${PIPESTATUS[0]}
echo "exit status $status, $((SECONDS - t0)) s"
exit $status
