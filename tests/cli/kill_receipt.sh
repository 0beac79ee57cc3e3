#!/usr/bin/env bash
# A run killed with SIGKILL leaves a readable receipt of the steps it finished.
source "$(dirname "$0")/lib.sh"
receipt="$WORK/killed.h5"
"$HARNESS" run --canary tiny --steps 5000 --threads 1 --out "$receipt" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -f "$receipt" ] && break; sleep 0.05; done
sleep 2
kill -9 "$pid"; wait "$pid" 2>/dev/null

expect_exit 2 "incomplete receipt" -- "$HARNESS" inspect "$receipt"
"$HARNESS" inspect --allow-incomplete --json "$receipt" > "$WORK/inspect.json" || fail "inspect --allow-incomplete"
$PY - "$receipt" "$WORK/inspect.json" <<'PYEOF' || fail "killed receipt is not a readable prefix"
import json, sys, h5py
j = json.load(open(sys.argv[2]))
assert j["complete"] is False, j["complete"]
n = j["steps_recorded"]
assert 1 <= n < 5000, n
# A killed run's file is still marked as open by an SWMR writer: readers say swmr=True.
with h5py.File(sys.argv[1], "r", swmr=True) as f:
    assert int(f["manifest"].attrs["complete"]) == 0
    assert f["steps/loss"].shape == (n,)
    assert f["hashes/params"].shape[0] == n
    assert all(x > 0 for x in f["steps/loss"][:])
print("killed after", n, "steps; receipt readable")
PYEOF
finish
