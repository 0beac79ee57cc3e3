#!/usr/bin/env bash
# libFuzzer under ASan + UBSan on the harness's file readers (docs/testing.md, "Fuzzing"):
#   fuzz_receipt  a receipt through harness validate's checks and the judging commands' reader
#   fuzz_budgets  a budgets file (canaries/budgets.toml's format)
#   fuzz_matrix   a nightly lane matrix (canaries/nightly.toml's format)
#   fuzz_canary   a canary file (canaries/tiny.toml's format; its token files stay in scratch)
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# Configures build-fuzz/ (or $HARNESS_FUZZ_BUILD_DIR; one configured with the fuzzers
# already, as scripts/test.sh --sanitize makes build-asan/, is used as it is) with clang++-14 and
# HARNESS_BUILD_FUZZERS=ON, builds the four fuzzers, then runs each for the given time on
# a scratch copy of its seed corpus (fuzz/corpus/<target>/; nothing is written into the
# checkout). Environment: HARNESS_FUZZ_TARGETS (default "receipt budgets matrix canary"),
# HARNESS_FUZZ_KEEP=1 keeps the scratch directory (new corpus entries, logs),
# HARNESS_FUZZ_SEED (default: drawn from /dev/urandom and printed): libFuzzer's -seed, so
# that a run's sequence of inputs can be repeated (as far as the time limit lets it go).
# Exit 0: no finding; 1: a crash, a leak, a timeout or a sanitizer report (the reproducer's
# path is printed, outside the checkout); 2: the build failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2; }
build=${HARNESS_FUZZ_BUILD_DIR:-$root/build-fuzz}
seed=${HARNESS_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
[[ $seed =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: HARNESS_FUZZ_SEED must be a positive integer, not '$seed'" >&2; exit 2; }
targets=(${HARNESS_FUZZ_TARGETS:-receipt budgets matrix canary})

"$root/scripts/install-deps.sh" >/dev/null || exit 2
start=$SECONDS
mkdir -p "$build"
# ccache (when installed) hits across clones and build directories: paths under the
# checkout are hashed relative to it, and the working directory is not hashed.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# A build directory configured with the fuzzers already (scripts/test.sh --sanitize's
# build-asan/, the same instrumentation with the tests beside it) is used as it is.
if grep -qsx 'HARNESS_BUILD_FUZZERS:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "fuzz: using the fuzzers' build in $build (configured with HARNESS_BUILD_FUZZERS=ON)"
else
  # -O1: libFuzzer's recommendation, and a quarter less compile time than -O3 under ASan.
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DHARNESS_BUILD_FUZZERS=ON -DHARNESS_SANITIZE=OFF -DHARNESS_TSAN=OFF \
    -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF >"$build/fuzz-configure.log" 2>&1 ||
    { cat "$build/fuzz-configure.log" >&2; echo "fuzz: configuring $build failed" >&2; exit 2; }
fi
cmake --build "$build" -j "${HARNESS_JOBS:-2}" --target "${targets[@]/#/fuzz_}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -n 40 "$build/fuzz-build.log" >&2; echo "fuzz: building the fuzzers failed (log: $build/fuzz-build.log)" >&2; exit 2; }
echo "fuzz: built ${targets[*]} in $((SECONDS - start)) s; seed $seed (repeat with HARNESS_FUZZ_SEED=$seed)"

work=$(mktemp -d "${TMPDIR:-/tmp}/harness-fuzz.XXXXXX")
[ "${HARNESS_FUZZ_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
# The fuzzers' own scratch files go under the scratch directory too.
export TMPDIR=$work
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One known HDF5 leak on corrupt object headers, explained in the file.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp:print_suppressions=0}

status=0
for t in "${targets[@]}"; do
  corpus=$work/$t/corpus artifacts=$work/$t/artifacts/
  mkdir -p "$corpus" "$artifacts"
  cp "$root/fuzz/corpus/$t/"* "$corpus/"
  log=$work/$t/fuzz.log
  "$build/fuzz/fuzz_$t" "$corpus" -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
  found=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    status=1
    echo "FAIL fuzz_$t: exit $rc after ${runs:-?} executions" >&2
    grep -m 4 -E '^==[0-9]+== ?ERROR|runtime error|deadly signal|terminate called|left open|SUMMARY' "$log" >&2
    for f in $found; do
      echo "  reproducer: $f" >&2
      echo "  run it:     LSAN_OPTIONS=$LSAN_OPTIONS $build/fuzz/fuzz_$t $f" >&2
    done
    echo "  log: $log" >&2
    trap - EXIT  # keep the reproducers
  else
    echo "ok   fuzz_$t: ${runs:-?} executions in ${seconds} s (${speed:-?} exec/s, ${cov:-cov ?}), no crash"
  fi
done
echo "fuzz: done in $((SECONDS - start)) s"
exit $status
