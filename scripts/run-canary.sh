#!/usr/bin/env bash
# README command 1: install what is missing, build, run 100 steps of the `tiny` canary on
# the cpu-ref engine, write a receipt and print its summary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
HARNESS_TARGET=harness "$root/scripts/build.sh" -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF
mkdir -p "$root/reports"
receipt="$root/reports/tiny-cpu-ref.h5"
"$root/build/bin/harness" run --canary tiny --engine cpu-ref --out "$receipt" --force "$@"
