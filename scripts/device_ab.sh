#!/usr/bin/env bash
# A/B in one device call: this tree against a base tree, built side by side, each benchmark
# command run on both in alternation, so a comparison never spans two machines (between calls the
# same binary moves by 1-2%: benchmarks/RESULTS.md).
#   Here (the working machine):
#     scripts/device_ab.sh --archive REF
#   writes .carry/base.tar, `git archive REF` without models/ (the call carries [".carry"]).
#   On the device:
#     scripts/device_ab.sh TARGETS ROUNDS COMMAND...
#   configures and builds the CMake targets TARGETS (comma-separated) for sm_90 in build-h200
#   (this tree) and in /tmp/ab-base/build (the archive) at the same time, with what the device has
#   installed (as scripts/device_run.sh: it has no network for scripts/setup.sh's apt), then runs
#   COMMAND ROUNDS times on each tree, base first, with every @BUILD@ in it replaced by that
#   tree's build folder. SPECDEC_AB_HEAD_TARGETS (comma-separated) are built in this tree only,
#   before any run (e.g. specdec_cuda_tests, to run the GPU tests after the A/B without compiling
#   while it measures). Each run's output is {base,head}_ROUND.txt in $OUT/ab_logs.tar.gz, with
#   the build logs (a call brings back few files). Where the output is Google Benchmark's console
#   table (repetitions with medians), $OUT/ab.md (and stdout) lists every median of round 1 and of
#   the last round, base beside head, with head / base.
#   Example: scripts/device_ab.sh specdec_bench_ops 2 @BUILD@/benchmarks/specdec_bench_ops
#            --benchmark_filter='^BM_sample/'
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--archive" ]; then
  ref=${2:?"usage: scripts/device_ab.sh --archive REF"}
  mkdir -p .carry
  git archive -o .carry/base.tar "$ref" -- $(git ls-tree --name-only "$ref" | grep -v '^models$')
  size=$(du -h .carry/base.tar | cut -f1)
  echo "device_ab: .carry/base.tar = $(git rev-parse --short "$ref") ($size)"
  exit 0
fi
[ $# -ge 3 ] || { echo "usage: scripts/device_ab.sh TARGETS ROUNDS COMMAND..." >&2; exit 2; }
targets=${1//,/ } rounds=$2
shift 2
out=${OUT:-./device-out}
base=/tmp/ab-base logs=/tmp/ab-logs
mkdir -p "$out" && rm -rf "$logs" && mkdir -p "$logs"
trap 'tar czf "$out/ab_logs.tar.gz" -C "$logs" .' EXIT
if [ ! -f .carry/base.tar ]; then
  echo "device_ab: .carry/base.tar missing (make it here with --archive REF)" >&2
  exit 2
fi
rm -rf "$base" && mkdir -p "$base" && tar -xf .carry/base.tar -C "$base"
cores=$(nproc)
build() {  # build TREE FOLDER JOBS LOG [EXTRA_TARGET...]
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$4" 2>&1 && cmake --build "$2" -j "$3" --target $targets "${@:5}" >> "$4" 2>&1
}
start=$SECONDS
build "$base" "$base/build" $((cores / 3 + 1)) "$logs/build_base.log" &
base_pid=$!
head_only=${SPECDEC_AB_HEAD_TARGETS:-}
build . build-h200 $((cores - cores / 3)) "$logs/build_head.log" ${head_only//,/ }
head_rc=$?
wait $base_pid
base_rc=$?
echo "device_ab: builds $((SECONDS - start)) s (head rc $head_rc, base rc $base_rc)"
for side in head base; do
  rc=$head_rc && [ $side = base ] && rc=$base_rc
  if [ "$rc" -ne 0 ]; then
    echo "device_ab: $side build failed:"
    grep -E "error|Error" -A3 "$logs/build_$side.log" | head -40
    exit 1
  fi
done
for ((r = 1; r <= rounds; ++r)); do
  for side in base head; do
    dir=$PWD/build-h200 && [ $side = base ] && dir=$base/build
    args=("${@//@BUILD@/$dir}")
    "${args[@]}" > "$logs/${side}_$r.txt" 2>&1 || echo "device_ab: $side round $r exit $?"
  done
done
python3 - "$logs" "$rounds" <<'PY' | tee "$out/ab.md"
import re, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
def medians(path):  # name -> median time in us, from Google Benchmark's console output
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    found = {}
    for line in open(path, errors="replace"):
        m = re.match(r"(\S+?)_median\s+([\d.]+) (ns|us|ms|s)\b", line)
        if m:
            name = re.sub(r"/(min_time|repeats):[^/ ]*|/manual_time|/real_time", "", m.group(1))
            found[name] = float(m.group(2)) * scale[m.group(3)]
    return found
for r in sorted({1, rounds}):
    base, head = medians(f"{logs}/base_{r}.txt"), medians(f"{logs}/head_{r}.txt")
    if not base and not head:
        print(f"round {r}: no Google Benchmark medians (see *_{r}.txt in ab_logs.tar.gz)")
        continue
    print(f"\n| round {r} | base (us) | head (us) | head / base |\n|---|---:|---:|---:|")
    for name in dict.fromkeys([*base, *head]):
        b, h = base.get(name), head.get(name)
        ratio = f"{h / b:.3f}" if b and h else "-"
        print(f"| {name} | {f'{b:.2f}' if b else '-'} | {f'{h:.2f}' if h else '-'} | {ratio} |")
PY
