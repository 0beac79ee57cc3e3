#!/usr/bin/env bash
# scripts/git-bisect-run.sh and `harness check --git-bisect` answer as `git bisect run`
# expects: 0 for a commit whose lane equals the good golden, 1 for one that moves it,
# 125 (skip) when the commit does not build, the lane does not run or the receipt cannot
# be judged; a missing golden stops the bisect (128), never a verdict on a commit.
source "$(dirname "$0")/lib.sh"
WRAPPER="$HERE/../../scripts/git-bisect-run.sh"
LANE=(--canary micro --steps 6 --engine accel --noise-seed 5)
"$HARNESS" run "${LANE[@]}" --out "$WORK/golden.h5" >/dev/null 2>&1 || fail "golden run"

bisect_run() { BISECT_SKIP_BUILD=1 BISECT_HARNESS="$HARNESS" bash "$WRAPPER" "$@"; }
expect_exit 0 "" -- bisect_run "$WORK/golden.h5" "${LANE[@]}"
expect_exit 1 "" -- bisect_run "$WORK/golden.h5" "${LANE[@]}" --inject-fault step=3,op=blocks.1.mlp.fc,ulps=1000
grep -q "step 3" "$WORK/stderr" || fail "a bad commit does not say where the lane moved: $(cat "$WORK/stderr")"
expect_exit 125 "the lane does not run" -- bisect_run "$WORK/golden.h5" "${LANE[@]}" --noise sometimes
expect_exit 128 "no such golden" -- bisect_run "$WORK/none.h5" "${LANE[@]}"
head -c 4000 "$WORK/golden.h5" > "$WORK/damaged.h5"
expect_exit 125 "cannot judge" -- bisect_run "$WORK/damaged.h5" "${LANE[@]}"

# a commit that does not build is skipped
mkdir "$WORK/broken" && echo "this is not cmake(" > "$WORK/broken/CMakeLists.txt"
(cd "$WORK/broken" && BISECT_ROOT="$WORK/broken" BISECT_BUILD_DIR="$WORK/broken/build" \
  bash "$WRAPPER" "$WORK/golden.h5" "${LANE[@]}") \
  >"$WORK/stdout" 2>"$WORK/stderr"
[ $? -eq 125 ] || fail "an unbuildable commit is not skipped: $(cat "$WORK/stderr")"

# the flag itself: equal 0, moved 1, unjudgeable 125 (instead of 2)
"$HARNESS" run "${LANE[@]}" --out "$WORK/moved.h5" --inject-fault step=2,op=blocks.0.attn.proj,ulps=1000 >/dev/null 2>&1
expect_exit 0 "" -- "$HARNESS" check "$WORK/golden.h5" --golden "$WORK/golden.h5" --git-bisect
expect_exit 1 "" -- "$HARNESS" check "$WORK/moved.h5" --golden "$WORK/golden.h5" --git-bisect
head -c 4000 "$WORK/golden.h5" > "$WORK/truncated.h5"
expect_exit 125 "" -- "$HARNESS" check "$WORK/moved.h5" --golden "$WORK/truncated.h5" --git-bisect
expect_exit 2 "" -- "$HARNESS" check "$WORK/moved.h5" --golden "$WORK/truncated.h5"
finish
