#!/usr/bin/env bash
# harness invariance (docs/invariance.md): the page run as written, its exit codes (0
# batch-invariant, 1 not, 2 bad input with one line) and its JSON's own consistency.
source "$(dirname "$0")/lib.sh"
run_page invariance.md
grep -q '^invariance  tiny/torch: ' "$WORK/page.out" || fail "the PyTorch lane's check did not run"
grep -q '^invariance  own-gpt/torch: ' "$WORK/page.out" || fail "the Python canary's check did not run"
[ "$(grep -c '^verdict     batch-invariant' "$WORK/page.out")" -ge 3 ] ||
  fail "cpu-ref, accel --noise off and tpu-mesh tp are not all batch-invariant: $(cat "$WORK/page.out")"
grep -qE '^verdict     not batch-invariant: smallest breaking batch size 2, first at op blocks\.' "$WORK/page.out" ||
  fail "accel's seeded noise is not caught at batch size 2"
"$PY" - "$WORK/split-k.json" <<'PY' || fail "the --split-k rows report is not consistent"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["lane"] == "tiny/accel+noise=off+split-k=rows" and not r["invariant"], r
sizes = [c["batch_size"] for c in r["checks"]]
assert sizes == list(range(2, 9)), sizes
broken = [c for c in r["checks"] if not c["bitwise"]]
assert broken and r["smallest_breaking_batch"] == broken[0]["batch_size"], r
assert all(c["first_op"] and c["max_logprob_delta"] > 0 for c in broken), broken
assert all(c["first_op"] is None and c["max_logprob_delta"] == 0 for c in r["checks"] if c["bitwise"]), r
assert all(0 <= c["position"] < c["batch_size"] for c in r["checks"]), r
PY
expect_exit 1 "" -- "$HARNESS" invariance --canary tiny --engine accel --max-batch 2
expect_exit 2 "--max-batch" -- "$HARNESS" invariance --max-batch 1
expect_exit 2 "--split-k: unknown choice 'sideways'" -- "$HARNESS" invariance --engine accel --split-k sideways
expect_exit 2 "the check runs batches of 1 to 4" -- \
  "$HARNESS" invariance --canary micro --engine tpu-mesh --mesh 2x1 --max-batch 4
expect_exit 2 "--canary" -- "$HARNESS" invariance --canary no-such-canary
finish
