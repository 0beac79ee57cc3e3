#!/usr/bin/env bash
# `git bisect run` wrapper: builds the harness at the commit under test, runs one lane and
# judges its receipt against a golden kept outside the tree. Exit 0 good, 1 bad, 125 skip
# (the commit does not build, the lane does not run, the receipt cannot be judged), 128 on
# a usage error (git bisect run stops on it). docs/git-bisect.md walks through it; copy
# this script out of the tree first (older commits do not have it).
#
#   git-bisect-run.sh GOLDEN.h5 [harness run flags...]
#
#   GOLDEN.h5        a receipt of the lane from a good commit, copied out of the tree (the
#                    tree's goldens change as git bisect checks out other commits)
#   run flags        the lane: --engine, --features, engine flags, --steps, ...
#
# Environment:
#   BISECT_BUILD_DIR   build directory (default: build-bisect, reused between commits)
#   BISECT_CHECKER     a harness binary that judges the receipt (default: the commit's own);
#                      pin one built from a recent commit so every commit is judged alike
#   BISECT_BUDGETS     budgets file for the judgement (default: the checker's default)
#   BISECT_ROOT        the source tree (default: the git checkout of the working directory)
#   BISECT_SKIP_BUILD  1: use $BISECT_HARNESS as it is (no build; for tests)
set -u
SKIP=125
ABORT=128  # git bisect run stops: the question itself is wrong, no commit can answer it
[ $# -ge 1 ] || { echo "usage: $0 GOLDEN.h5 [harness run flags...]" >&2; exit $ABORT; }
GOLDEN=$1
shift
ROOT=${BISECT_ROOT:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}
BUILD=${BISECT_BUILD_DIR:-$ROOT/build-bisect}
[ -f "$GOLDEN" ] || { echo "git-bisect-run: $GOLDEN: no such golden; give a receipt from a good commit" >&2; exit $ABORT; }

if [ "${BISECT_SKIP_BUILD:-0}" = 1 ]; then
  HARNESS=${BISECT_HARNESS:?BISECT_SKIP_BUILD=1 needs BISECT_HARNESS}
else
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF \
    >"$BUILD.log" 2>&1 && cmake --build "$BUILD" -j"$(nproc)" --target harness >>"$BUILD.log" 2>&1 ||
    { echo "git-bisect-run: the commit does not build (see $BUILD.log): skip" >&2; exit $SKIP; }
  HARNESS=$BUILD/bin/harness
fi
CHECKER=${BISECT_CHECKER:-$HARNESS}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$HARNESS" run --out "$WORK/run.h5" "$@" >"$WORK/run.log" 2>&1 ||
  { echo "git-bisect-run: the lane does not run: $(tail -n 1 "$WORK/run.log"): skip" >&2; exit $SKIP; }
budgets=()
[ -n "${BISECT_BUDGETS:-}" ] && budgets=(--budgets "$BISECT_BUDGETS")
# Exit codes mapped here, not by `check --git-bisect`: an old commit's own harness (the
# default checker) does not know that flag.
"$CHECKER" check "$WORK/run.h5" --golden "$GOLDEN" ${budgets[@]+"${budgets[@]}"} >"$WORK/check.log" 2>&1
code=$?
case $code in
  0) echo "git-bisect-run: good" >&2 ;;
  1) echo "git-bisect-run: bad: $(grep -m1 -E 'FAIL|first' "$WORK/check.log")" >&2
     "$CHECKER" bisect "$WORK/run.h5" "$GOLDEN" --no-replay >&2 ;;
  *) echo "git-bisect-run: cannot judge: $(tail -n 1 "$WORK/check.log"): skip" >&2; code=$SKIP ;;
esac
exit $code
