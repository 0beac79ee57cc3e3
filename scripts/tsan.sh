#!/usr/bin/env bash
# ThreadSanitizer on the thread-count and engine tests (docs/testing.md, "ThreadSanitizer")
# that run the micro canary: cpu-ref across thread counts, accel with off, seeded and racy
# noise (bf16 and fp8), tpu-mesh on 2x2 meshes (tp and zero3, on 1, 2 and 3 threads), its
# compile cache and leaked scalars, and the op traces of every engine across thread counts,
# from harness_unit_tests. The tiny-canary tests are left out: under TSan, with Debian's
# uninstrumented oneTBB, every access inside a parallel loop is a suppressed report whose
# stack TSan restores, and one 3-step tiny accel run did not finish its first step in 16
# minutes.
#
#   scripts/tsan.sh [GTEST_FILTER]
#
# Builds harness_unit_tests into build-tsan/ (or $HARNESS_TSAN_BUILD_DIR) with
# HARNESS_TSAN=ON (the default compiler, GCC 12), then runs the selected tests with the
# suppressions of scripts/tsan.supp (oneTBB's own code only). Exit 0: every test passed
# and TSan reported nothing; 1: a report or a failing test (the log's path is printed);
# 2: the build failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HARNESS_TSAN_BUILD_DIR:-$root/build-tsan}
micro_tests=(
  Determinism.MicroFullRunIsIdenticalAtOneAndThreeThreads Determinism.SeedChangesTheRun
  AccelNoise.MicroRunsEveryNoiseModeOnOneAndThreeThreads
  TpuMeshRun.FixedMeshAndPlanIsBitwiseReproducibleOnAnyThreadCount TpuMeshRun.CompilesOnceColdAndNeverWarm
  TpuMeshRun.LeakedScalarRecompilesEveryStepWithTheSameNumerics TpuMeshRun.CorruptCacheEntryIsEvictedAndRecompiledNeverTrusted
  TpuMeshRun.UnwritableCacheDirRunsWithoutPersistence
  OpTrace.EveryEngineTracesTheSameOpsInTheSameOrder OpTrace.OneMeshDeviceTracesCpuRefBitForBitOnEveryPlan
  OpTrace.MicroBatchedStepsAssembleTheSameTraceInBothCompileModes OpTrace.TracedProgramsLoadFromThePersistentCache
  OpTrace.TracingNeverChangesTheNumbers OpTrace.TheOptimizerOutputsAreTheRecordedParameters
  OpTrace.TracesAreIdenticalOnAnyThreadCount)
default_filter=$(IFS=:; echo "${micro_tests[*]}")
filter=${1:-$default_filter}

"$root/scripts/install-deps.sh" >/dev/null || exit 2
start=$SECONDS
mkdir -p "$build"
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHARNESS_TSAN=ON -DHARNESS_SANITIZE=OFF \
  -DHARNESS_BUILD_FUZZERS=OFF -DHARNESS_BUILD_TESTS=ON -DHARNESS_BUILD_BENCH=OFF >"$build/tsan-configure.log" 2>&1 ||
  { cat "$build/tsan-configure.log" >&2; echo "tsan: configuring $build failed" >&2; exit 2; }
cmake --build "$build" -j "${HARNESS_JOBS:-2}" --target harness_unit_tests >"$build/tsan-build.log" 2>&1 ||
  { tail -n 40 "$build/tsan-build.log" >&2; echo "tsan: building failed (log: $build/tsan-build.log)" >&2; exit 2; }
built=$((SECONDS - start))
echo "tsan: built harness_unit_tests in ${built} s"

work=$(mktemp -d "${TMPDIR:-/tmp}/harness-tsan.XXXXXX")
log=$work/tsan.log
# halt_on_error: the first report ends the run; exitcode 66 tells a report from a failed test.
# history_size=7 (the largest): the stack of an access made inside a TBB task long before
# the report must be restored, or the oneTBB suppression cannot see its TBB frames (a
# sketcher read by a worker, freed by the main thread after the loop's join: measured as a
# report with "failed to restore the stack" at the default history size).
export TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp:halt_on_error=1:second_deadlock_stack=1:history_size=7:exitcode=66${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
(cd "$work" && TMPDIR=$work "$build/tests/harness_unit_tests" --gtest_filter="$filter" --gtest_brief=1) >"$log" 2>&1
rc=$?
tests=$(sed -n 's/^\[==========\] \([0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' "$log" | tail -n 1)
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log" | tail -n 1)
reports=$(grep -c '^WARNING: ThreadSanitizer' "$log")
if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
  if [ "$reports" -ne 0 ]; then
    echo "FAIL tsan: ThreadSanitizer reported ($(grep -m1 '^WARNING: ThreadSanitizer' "$log"))" >&2
    grep -m1 -A12 '^WARNING: ThreadSanitizer' "$log" >&2
  else
    echo "FAIL tsan: harness_unit_tests exited $rc" >&2
    grep -E '^\[  FAILED  \]' "$log" >&2
  fi
  echo "  log: $log" >&2
  exit 1
fi
rm -rf "$work"
echo "ok   tsan: ${passed:-${tests:-?}} tests passed under ThreadSanitizer, no report ($((SECONDS - start - built)) s to run; filter $filter)"
