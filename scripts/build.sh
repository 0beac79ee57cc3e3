#!/usr/bin/env bash
# Configures and builds into build/ (or $HARNESS_BUILD_DIR). Extra arguments go to cmake.
#   scripts/build.sh                       Release, tests and benchmarks
#   scripts/build.sh -DHARNESS_SANITIZE=ON (with HARNESS_BUILD_DIR=build-asan)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HARNESS_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${HARNESS_BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "${HARNESS_JOBS:-2}" ${HARNESS_TARGET:+--target "$HARNESS_TARGET"}
