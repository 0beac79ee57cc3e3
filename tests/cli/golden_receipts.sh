#!/usr/bin/env bash
# Goldens of receipts made elsewhere (docs/goldens.md, "refresh --receipt"): a receipt
# becomes its lane's candidate without running any lane, is approved and logged with
# "source": "receipt", is listed by status with and without a matrix, and is the golden
# `check` judges against; an incomplete, damaged, perturbed or doubled receipt, --lanes beside
# --receipt, and CI are refused with exit 2 and change nothing.
source "$(dirname "$0")/lib.sh"
G="$WORK/goldens"
mkdir -p "$G"
unset CI
golden() { "$HARNESS" golden "$@" --goldens "$G"; }
state() { (cd "$G" && find . -type f | sort | xargs -r sha256sum); }
"$HARNESS" run --canary micro --steps 3 --out "$WORK/a.h5" >/dev/null 2>&1 || fail "harness run a"
"$HARNESS" run --canary micro --steps 3 --threads 2 --out "$WORK/b.h5" >/dev/null 2>&1 || fail "harness run b"
cp "$WORK/a.h5" "$WORK/incomplete.h5"
"$PY" - "$WORK/incomplete.h5" <<'PY' || fail "could not mark a receipt incomplete"
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["manifest"].attrs.modify("complete", 0)
PY
head -c 5000 "$WORK/a.h5" >"$WORK/truncated.h5"
"$HARNESS" run --canary micro --steps 3 --perturb-init 4 --out "$WORK/perturbed.h5" >/dev/null 2>&1 || fail "perturbed run"

# refused, and nothing written
empty=$(state)
expect_exit 2 "incomplete receipt" -- golden refresh --receipt "$WORK/incomplete.h5" --reason x
expect_exit 2 "truncated.h5" -- golden refresh --receipt "$WORK/truncated.h5" --reason x
expect_exit 2 "perturbed.h5: its initial weights were perturbed \(init_perturbation_seed 4\)" -- \
  golden refresh --receipt "$WORK/perturbed.h5" --reason x
expect_exit 2 "both of lane micro/cpu-ref" -- golden refresh --receipt "$WORK/a.h5" --receipt "$WORK/b.h5" --reason x
expect_exit 2 "not both" -- golden refresh --receipt "$WORK/a.h5" --lanes cpu-ref --reason x
expect_exit 2 "CI is set" -- env CI=true "$HARNESS" golden refresh --goldens "$G" --receipt "$WORK/a.h5" --reason x
[ "$empty" = "$(state)" ] || fail "a refused refresh wrote into the goldens directory: $(ls -R "$G")"

# a receipt becomes the lane's candidate, then its golden, logged as a receipt's
expect_exit 0 "" -- golden refresh --receipt "$WORK/a.h5" --reason "micro from a receipt"
grep -q "micro/cpu-ref .*new" "$WORK/stdout" || fail "refresh --receipt did not review a new candidate: $(cat "$WORK/stdout")"
cmp -s "$WORK/a.h5" "$G/micro/cpu-ref.candidate.h5" || fail "the candidate is not the receipt, byte for byte"
expect_exit 0 "" -- golden approve --approved-by "Ada Lovelace" --allow-dirty  # this build may be of a dirty tree
cmp -s "$WORK/a.h5" "$G/micro/cpu-ref.h5" || fail "the golden is not the receipt, byte for byte"
"$PY" - "$G/provenance.jsonl" "$WORK/a.h5" <<'PY' || fail "the log does not record the receipt's golden"
import json, sys, h5py
entry = json.loads(open(sys.argv[1]).read().splitlines()[-1])
with h5py.File(sys.argv[2], "r") as f:
    commit = f["manifest"].attrs["git_commit"]
    commit = commit.decode() if isinstance(commit, bytes) else commit
assert entry["source"] == "receipt" and entry["lane"] == "micro/cpu-ref" and entry["git_commit"] == commit, entry
assert entry["reason"] == "micro from a receipt" and entry["comparison"]["verdict"] == "new", entry
PY
expect_exit 0 "" -- golden status --no-matrix
grep -qE "^ok +micro/cpu-ref +micro/cpu-ref" "$WORK/stdout" || fail "status --no-matrix does not list the lane: $(cat "$WORK/stdout")"
expect_exit 1 "" -- golden status --matrix "$HERE/data/micro_nightly.toml"
grep -qE "^ok +[^ ]+ +micro/cpu-ref" "$WORK/stdout" || fail "status with a matrix does not list the golden: $(cat "$WORK/stdout")"
grep -q "orphaned" "$WORK/stdout" && fail "status calls a receipt's golden orphaned: $(cat "$WORK/stdout")"

# the golden judges: another thread count is bitwise; a changed golden is refused
expect_exit 0 "" -- "$HARNESS" check "$WORK/b.h5" --goldens "$G"
grep -q "^verdict     PASS" "$WORK/stdout" || fail "check against the receipt's golden did not pass: $(cat "$WORK/stdout")"
# refreshed again from the same receipt: reviewed as a pass against the golden
expect_exit 0 "" -- golden refresh --receipt "$WORK/b.h5" --reason "same bits"
grep -q "micro/cpu-ref .*pass" "$WORK/stdout" || fail "a receipt equal to its golden is not reviewed as a pass: $(cat "$WORK/stdout")"
expect_exit 0 "" -- golden reject
finish
