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
#   COMMAND ROUNDS times on each tree, with every @BUILD@ in it replaced by that tree's build
#   folder: odd rounds base, head, then the variants below; even rounds the reverse order
#   (within a call, the same kernels run second measured ~0.5% faster: benchmarks/RESULTS.md,
#   2026-12-05, fourth session), so take ROUNDS even. SPECDEC_AB_HEAD_TARGETS (comma-separated)
#   are built in this tree only, before any run (e.g. specdec_cuda_tests, to run the GPU tests
#   after the A/B without compiling while it measures). Each run's output is
#   {base,head}_ROUND.txt in $OUT/ab_logs.tar.gz, with the build logs (a call brings back few
#   files). SPECDEC_AB_HEAD_ENVS (variants separated by ';', each one or more space-separated
#   VAR=VALUE) runs this tree's COMMAND again in each round under each variant's environment, as
#   head+1_ROUND.txt, head+2_... (one build, several switches of an experiment). $OUT/ab.md (and
#   stdout) lists round 1, the last round and, over 2+ rounds, the mean of all rounds: base
#   beside head and the variants, each over base; every median where the output is Google
#   Benchmark's console table (repetitions with medians), every step's graph ms where it is
#   specdec_bench_kimi_step's table.
#   SPECDEC_AB_NO_BASE=1: no base tree (no archive needed): this tree alone is built, with
#   every core, and its plain runs are what the variants are compared with; for switches that
#   are off by default, whose off runs are the base's kernels (one build instead of two).
#   Prebuilt (no build on the device, whose minutes count): here,
#     scripts/device_ab.sh --pack BASE_BUILD HEAD_BUILD PATH...
#   strips each PATH (relative to a build folder built for sm_90, e.g.
#   benchmarks/specdec_bench_ops) of both folders into .carry/ab.tar.gz, with the shared libraries
#   they link that are not CUDA's (Google Benchmark's soname differs between the machines); the
#   call carries [".carry/ab.tar.gz"] and runs with SPECDEC_AB_PREBUILT=1 and any TARGETS
#   (unused): @BUILD@ is then the unpacked base / head folder.
#   Examples: scripts/device_ab.sh specdec_bench_ops 2 @BUILD@/benchmarks/specdec_bench_ops
#             --benchmark_filter='^BM_sample/'
#             SPECDEC_AB_HEAD_ENVS='SPECDEC_X=0;SPECDEC_X=1' scripts/device_ab.sh
#             specdec_bench_kimi_step 2 @BUILD@/benchmarks/specdec_bench_kimi_step --spec-tokens 0
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
if [ "${1:-}" = "--pack" ]; then
  [ $# -ge 4 ] ||
    { echo "usage: scripts/device_ab.sh --pack BASE_BUILD HEAD_BUILD PATH..." >&2; exit 2; }
  stage=$(mktemp -d) && mkdir -p "$stage/lib"
  for side in base head; do
    from=$2 && [ $side = head ] && from=$3
    for path in "${@:4}"; do
      [ -x "$from/$path" ] || { echo "device_ab: $from/$path is not an executable" >&2; exit 2; }
      mkdir -p "$stage/$side/$(dirname "$path")"
      cp "$from/$path" "$stage/$side/$path" && strip "$stage/$side/$path"
      # Libraries outside the C / C++ runtimes, CUDA's and NCCL, which the device has.
      ldd "$from/$path" | awk '$3 ~ /^\// {print $1, $3}' |
        grep -Ev '^(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)' |
        grep -Ev '^(libcu|libnv|libnccl|ld-linux)' |
        awk '{print $2}' | xargs -r cp -L -t "$stage/lib"
    done
  done
  mkdir -p .carry && tar czf .carry/ab.tar.gz -C "$stage" . && rm -rf "$stage"
  echo "device_ab: .carry/ab.tar.gz ($(du -h .carry/ab.tar.gz | cut -f1))"
  exit 0
fi
[ $# -ge 3 ] || { echo "usage: scripts/device_ab.sh TARGETS ROUNDS COMMAND..." >&2; exit 2; }
targets=${1//,/ } rounds=$2
shift 2
out=${OUT:-./device-out}
base=/tmp/ab-base logs=/tmp/ab-logs
mkdir -p "$out" && rm -rf "$logs" && mkdir -p "$logs"
trap 'tar czf "$out/ab_logs.tar.gz" -C "$logs" .' EXIT
no_base=${SPECDEC_AB_NO_BASE:-}
if [ -n "$no_base" ] && [ -z "${SPECDEC_AB_HEAD_ENVS:-}" ]; then
  echo "device_ab: SPECDEC_AB_NO_BASE needs SPECDEC_AB_HEAD_ENVS (nothing to compare)" >&2
  exit 2
fi
prebuilt=${SPECDEC_AB_PREBUILT:-}
if [ -n "$prebuilt" ]; then  # --pack's binaries: no build
  [ -f .carry/ab.tar.gz ] || { echo "device_ab: .carry/ab.tar.gz missing (--pack)" >&2; exit 2; }
  packed=/tmp/ab-prebuilt && rm -rf "$packed" && mkdir -p "$packed"
  tar xzf .carry/ab.tar.gz -C "$packed"
  export LD_LIBRARY_PATH=$packed/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  no_base=
fi
[ -z "$no_base" ] && [ -z "$prebuilt" ] && [ ! -f .carry/base.tar ] &&
  { echo "device_ab: .carry/base.tar missing (make it here with --archive REF)" >&2; exit 2; }
[ -z "$no_base" ] && [ -z "$prebuilt" ] && rm -rf "$base" && mkdir -p "$base" &&
  tar -xf .carry/base.tar -C "$base"
cores=$(nproc)
build() {  # build TREE FOLDER JOBS LOG [EXTRA_TARGET...]
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    > "$4" 2>&1 && cmake --build "$2" -j "$3" --target $targets "${@:5}" >> "$4" 2>&1
}
start=$SECONDS
base_rc=0 head_rc=0 head_cores=$cores
if [ -n "$prebuilt" ]; then :
elif [ -z "$no_base" ]; then
  build "$base" "$base/build" $((cores / 3 + 1)) "$logs/build_base.log" &
  base_pid=$!
  head_cores=$((cores - cores / 3))
fi
head_only=${SPECDEC_AB_HEAD_TARGETS:-}
if [ -z "$prebuilt" ]; then
  build . build-h200 $head_cores "$logs/build_head.log" ${head_only//,/ }
  head_rc=$?
  [ -z "$no_base" ] && { wait $base_pid; base_rc=$?; }
fi
echo "device_ab: builds $((SECONDS - start)) s (head rc $head_rc, base rc $base_rc)"
for side in head base; do
  rc=$head_rc && [ $side = base ] && rc=$base_rc
  if [ "$rc" -ne 0 ]; then
    echo "device_ab: $side build failed:"
    grep -E "error|Error" -A3 "$logs/build_$side.log" | head -40
    exit 1
  fi
done
IFS=';' read -r -a variants <<< "${SPECDEC_AB_HEAD_ENVS:-}"
sides=(base head)
[ -n "$no_base" ] && sides=(head)
for ((v = 1; v <= ${#variants[@]}; ++v)); do sides+=("head+$v"); done
for ((r = 1; r <= rounds; ++r)); do
  order=("${sides[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#sides[@]} - 1; i >= 0; --i)); do order+=("${sides[i]}"); done
  fi
  for side in "${order[@]}"; do
    dir=$PWD/build-h200 && [ $side = base ] && dir=$base/build
    [ -n "$prebuilt" ] && dir=$packed/${side%%+*}
    args=("${@//@BUILD@/$dir}")
    env=()
    if [ "${side#head+}" != "$side" ]; then read -r -a env <<< "${variants[${side#head+} - 1]}"; fi
    env "${env[@]}" "${args[@]}" > "$logs/${side}_$r.txt" 2>&1 ||
      echo "device_ab: $side round $r exit $?"
  done
done
for ((v = 1; v <= ${#variants[@]}; ++v)); do echo "device_ab: head+$v = ${variants[v - 1]}"; done
python3 - "$logs" "$rounds" "${sides[@]}" <<'PY' | tee "$out/ab.md"
import re, sys
logs, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def medians(path):  # name -> median time in us, from Google Benchmark's console output
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    found = {}
    for line in open(path, errors="replace"):
        m = re.match(r"(\S+?)_median\s+([\d.]+) (ns|us|ms|s)\b", line)
        if m:
            name = re.sub(r"/(min_time|repeats):[^/ ]*|/manual_time|/real_time", "", m.group(1))
            found[name] = float(m.group(2)) * scale[m.group(3)]
    return found
def step_graph_ms(path):  # step -> graph ms, from specdec_bench_kimi_step's forward table
    found = {}
    for line in open(path, errors="replace"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        # | step | T | eager ms | host ms | graph no PDL ms | graph ms | min ms | max ms | ...
        if len(cells) >= 12 and cells[1].isdigit() and re.fullmatch(r"[\d.]+", cells[5]):
            found[cells[0]] = float(cells[5])
    return found
def mean_runs(parse):  # side -> name -> mean over the rounds where the name was found
    means = []
    for side in sides:
        seen = {}
        for r in range(1, rounds + 1):
            for name, v in parse(f"{logs}/{side}_{r}.txt").items():
                seen.setdefault(name, []).append(v)
        means.append({name: sum(vs) / len(vs) for name, vs in seen.items()})
    return means
for r in sorted({1, rounds}) + (["mean"] if rounds > 1 else []):
    for parse, unit in ((medians, "us"), (step_graph_ms, "graph ms")):
        if r == "mean":
            runs = mean_runs(parse)
        else:
            runs = [parse(f"{logs}/{side}_{r}.txt") for side in sides]
        if not any(runs):
            continue
        title = f"mean of {rounds} rounds" if r == "mean" else f"round {r}"
        print(f"\n| {title} | " + " | ".join(f"{s} ({unit})" for s in sides) + " | " +
              " | ".join(f"{s} / {sides[0]}" for s in sides[1:]) + " |")
        print("|---|" + "---:|" * (2 * len(sides) - 1))
        for name in dict.fromkeys(n for run in runs for n in run):
            values = [run.get(name) for run in runs]
            b = values[0]
            cells = [f"{v:.3f}" if v else "-" for v in values]
            cells += [f"{v / b:.3f}" if v and b else "-" for v in values[1:]]
            print(f"| {name} | " + " | ".join(cells) + " |")
        break
    else:
        print(f"round {r}: no Google Benchmark medians or step table (see *_{r}.txt in "
              "ab_logs.tar.gz)")
PY
