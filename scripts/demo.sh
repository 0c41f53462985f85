#!/usr/bin/env bash
# Set-up, build and the main job on the embedded default: the Kimi reference binary on its tiny
# random preset (a 4-layer DeepseekV3 / Kimi-K2.5-shaped target, written on the spot, with a
# random EAGLE-3 draft over layers 0, 1, 2, and a random EAGLE-1/2 draft) generating 200 greedy
# tokens plainly, with an EAGLE-3 tree, an EAGLE-1/2 chain and an n-gram chain: the same output,
# so the same checksum (on the CPU; on the GPU up to near-ties), with the accept length, per-position acceptance and time split of each (a random
# draft accepts ~nothing; prompt lookup accepts where the greedy text repeats). Then the synthetic
# draft/target demo, whose draft is good enough to show acceptance.
#   scripts/demo.sh [--device cuda]   (extra flags go to specdec-kimi generate)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${SPECDEC_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja
cmake --build "$build" -j "${SPECDEC_JOBS:-$(nproc)}" --target specdec-kimi specdec-demo
kimi=$build/examples/specdec-kimi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$kimi" init-random --preset tiny --out "$dir/tiny" --seed 11 --draft eagle3 --layers 0,1,2 \
  --draft-out "$dir/draft" 2> /dev/null
"$kimi" init-random --preset tiny --out "$dir/tiny-again" --seed 11 --draft eagle \
  --draft-out "$dir/eagle" 2> /dev/null
run() {
  echo "== specdec-kimi generate $*"
  "$kimi" generate --model-path "$dir/tiny" --input-ids 7,8,9 --max-new-tokens 200 --ignore-eos \
    --json "$@" 2> >(grep -v "^load" >&2) | python3 -c '
import json, sys
j = json.load(sys.stdin)
ids = j["output_ids"]
print("%d output ids, first 16: %s, checksum %d" % (len(ids), ids[:16], sum((i + 1) * t for i, t in enumerate(ids)) % 1000003))
print("accept length %.3f, accept rate %.3f, per position %s, %d verifies, %.0f tokens/s"
      % (j["accept_length"], j["accept_rate"], [round(x, 3) for x in j["per_position_accept"]],
         j["verify_ct"], j["tokens_per_s"]))
print("time (s):", {k: round(v, 5) for k, v in j["time_s"].items()})'
}
run "$@"
run --speculative-algorithm EAGLE3 --speculative-draft-model-path "$dir/draft" \
  --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 "$@"
run --speculative-algorithm EAGLE --speculative-draft-model-path "$dir/eagle" \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "$@"
run --speculative-algorithm NGRAM --speculative-num-steps 2 --speculative-eagle-topk 1 \
  --speculative-num-draft-tokens 3 "$@"
echo "== specdec-demo (synthetic draft / target pair)"
"$build"/examples/specdec-demo
