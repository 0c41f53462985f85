#!/usr/bin/env bash
# Set-up, build and the main job on the embedded default: specdec-kimi on the embedded demo
# (models/demo: a small Kimi-K2.5-architecture model trained on Python source from Debian, and an
# EAGLE-3 draft trained on its outputs; tools/demo made both). The same prompt is completed
# greedily with EAGLE-3 (the default: a chain of 3 draft steps) and plainly. The two texts must be
# equal (greedy speculation is lossless); the script prints the text, the accept length,
# per-position acceptance, the time split and both decode rates with their ratio.
#   scripts/demo.sh [--device cuda]   (extra flags go to specdec-kimi generate)
# On the CPU a verify of 4 tokens costs about 3 decode steps of this small model (its weights sit
# in cache, so the forward is compute-bound) and speculation does not pay there; on a GPU, where a
# step costs its latency, it does (benchmarks/RESULTS.md, "The embedded demo").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${SPECDEC_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja
cmake --build "$build" -j "${SPECDEC_JOBS:-$(nproc)}" --target specdec-kimi
kimi=$build/examples/specdec-kimi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
prompt='class LRUCache:
    """A mapping that keeps the most recently used items."""

    def __init__(self, maxsize=128):
'
run() {
  local name=$1
  shift
  echo "== specdec-kimi generate --prompt ... --max-new-tokens 160 $*"
  "$kimi" generate --prompt "$prompt" --max-new-tokens 160 --ignore-eos --json "$@" \
    > "$dir/$name.json" 2> >(grep -v "^load" >&2)
}
run spec "$@"
run plain --speculative-algorithm NONE "$@"
python3 - "$dir/spec.json" "$dir/plain.json" "$prompt" <<'EOF'
import json, sys
spec, plain = (json.load(open(p)) for p in sys.argv[1:3])
print("--- prompt\n" + sys.argv[3] + "--- completion (EAGLE-3)\n" + spec["text"] + "\n---")
if spec["output_ids"] != plain["output_ids"]:
    sys.exit("EAGLE-3 and plain decoding differ: speculation lost the target's greedy output")
print("EAGLE-3 output == plain output (%d tokens)" % len(spec["output_ids"]))
print("%s: accept length %.3f, per position %s, %d verifies" % (
    spec["speculative_config"], spec["accept_length"],
    [round(x, 3) for x in spec["per_position_accept"]], spec["verify_ct"]))
print("time (s):", {k: round(v, 5) for k, v in spec["time_s"].items()})
print("decode: EAGLE-3 %.0f tokens/s, plain %.0f tokens/s: %.2fx on %s" % (
    spec["decode_tokens_per_s"], plain["decode_tokens_per_s"],
    spec["decode_tokens_per_s"] / plain["decode_tokens_per_s"], spec["device"]))
EOF
