#!/usr/bin/env bash
# README command 2: install what is missing, build everything, pass every test.
#   scripts/test.sh             Release build in build/
#   scripts/test.sh --sanitize  AddressSanitizer + UBSan build in build-asan/ (Clang 14, -O1, the fuzzers too)
#   scripts/test.sh --sanitize --quick   the same build; every suite but the five longest
#                               under ASan (label sanitizer-long): CI's sanitizer tier
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exclude=()
if [ "${1:-}" = "--sanitize" ] && [ "${2:-}" = "--quick" ]; then
  exclude=(-LE sanitizer-long)
elif [ -n "${2:-}" ] || { [ -n "${1:-}" ] && [ "$1" != "--sanitize" ]; }; then
  echo "scripts/test.sh: error: unknown arguments '$*'; use none, --sanitize or --sanitize --quick" >&2
  exit 2
fi
"$root/scripts/install-deps.sh"
if [ "${1:-}" = "--sanitize" ]; then
  export HARNESS_BUILD_DIR=$root/build-asan
  # One instrumented build serves the sanitizer suites and the fuzzers (scripts/fuzz.sh takes
  # it with HARNESS_FUZZ_BUILD_DIR=build-asan; docs/testing.md): Clang 14, whose libFuzzer
  # needs the coverage instrumentation, at -O1, libFuzzer's and ASan's recommended level and
  # a quarter less compile time than -O3. A build-asan/ made by another compiler starts over.
  if [ -f "$HARNESS_BUILD_DIR/CMakeCache.txt" ] &&
     ! grep -qx 'CMAKE_CXX_COMPILER:FILEPATH=.*clang++-14' "$HARNESS_BUILD_DIR/CMakeCache.txt"; then
    rm -rf "$HARNESS_BUILD_DIR/CMakeCache.txt" "$HARNESS_BUILD_DIR/CMakeFiles"
  fi
  "$root/scripts/build.sh" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DHARNESS_SANITIZE=ON -DHARNESS_BUILD_FUZZERS=ON \
    -DHARNESS_BUILD_TESTS=ON -DHARNESS_BUILD_BENCH=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # HDF5's own leaks on some corrupt files (inside libhdf5 only; the file says why).
  export LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0
  # The whole-receipt mutation test samples fewer mutants here: each is five sanitized
  # processes, and the Release run covers the full sample.
  export MUTANTS=${MUTANTS:-60}
  # The Python suites run in the plain build; here one smoke of them (python.smoke, the
  # conformance tests) holds the sanitized harness to the package (tests/CMakeLists.txt).
else
  export HARNESS_BUILD_DIR=$root/build
  # Tests and benchmarks on, whatever the cache holds: command 1 configures build/ without them.
  "$root/scripts/build.sh" -DHARNESS_SANITIZE=OFF -DHARNESS_BUILD_TESTS=ON -DHARNESS_BUILD_BENCH=ON
fi
# --no-tests=error: a build that registered no test fails instead of passing vacuously.
# ctest runs every suite, C++ and Python: the GoogleTest and CLI tests, the PyTorch twin,
# and pytest on python/tests (python.canary_harness on Debian's torch after `pip install
# ./python` into a fresh virtual environment, python.torch2 on .venv/'s torch 2.9 in-tree,
# the zoo; tests/CMakeLists.txt).
ctest --test-dir "$HARNESS_BUILD_DIR" -j 2 --output-on-failure --no-tests=error "${exclude[@]}"
