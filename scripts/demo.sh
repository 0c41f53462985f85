#!/usr/bin/env bash
# Set-up, build and the main job: the speculative-decoding demo on its embedded synthetic
# draft/target pair (propose -> build -> verify -> commit), on the GPU when one is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${SPECDEC_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja
cmake --build "$build" -j "${SPECDEC_JOBS:-$(nproc)}" --target specdec-demo
"$build"/examples/specdec-demo "$@"
