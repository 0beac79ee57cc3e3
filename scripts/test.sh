#!/usr/bin/env bash
# README command 2: install what is missing, build everything, pass every test.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  AddressSanitizer + UBSan build in build-asan/
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
if [ "${1:-}" = "--sanitize" ]; then
  export HARNESS_BUILD_DIR=$root/build-asan
  "$root/scripts/build.sh" -DHARNESS_SANITIZE=ON -DHARNESS_BUILD_BENCH=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # The twin drives the sanitized harness from Python; torch and ASan share no process.
else
  export HARNESS_BUILD_DIR=$root/build
  "$root/scripts/build.sh" -DHARNESS_SANITIZE=OFF
fi
ctest --test-dir "$HARNESS_BUILD_DIR" -j 2 --output-on-failure
