#!/usr/bin/env bash
# Set-up, build and the whole test suite (CPU tests always; GPU tests run where a GPU is present
# and report themselves skipped elsewhere). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${SPECDEC_BUILD_DIR:-build}
jobs=${SPECDEC_JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja "$@"
cmake --build "$build" -j "$jobs"
rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" 2>&1 | tee "$build/ctest.log" || rc=$?
# ctest lists skipped (GPU) tests after its summary; end with the summary line itself.
grep -E "tests passed|tests failed" "$build/ctest.log" | tail -1
exit $rc
