#!/usr/bin/env bash
# A run stopped with SIGINT or SIGTERM finishes its step, closes its receipt (complete = 0)
# and says so in one line, exit 130 or 143; a reader follows a running job's receipt
# (SWMR); a second writer of a path a live run is writing is refused, with or without
# --force, and the first run's receipt stays intact; a killed writer's lock is no lock.
source "$(dirname "$0")/lib.sh"

# wait_for_steps FILE N: until FILE holds at least N steps, read while its run writes it.
wait_for_steps() {
  for _ in $(seq 1 600); do
    if "$HARNESS" inspect --allow-incomplete --json "$1" >"$WORK/live.json" 2>/dev/null &&
       [ "$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps_recorded"])' "$WORK/live.json")" -ge "$2" ]; then
      return 0
    fi
    sleep 0.05
  done
  return 1
}

for signal in INT TERM; do
  r="$WORK/stopped-$signal.h5"
  "$HARNESS" run --canary tiny --out "$r" >"$WORK/out-$signal" 2>"$WORK/err-$signal" &
  pid=$!
  wait_for_steps "$r" 3 || fail "SIG$signal: no step could be read while the run wrote $r"
  kill -s "$signal" "$pid"
  wait "$pid"; code=$?
  want=$([ "$signal" = INT ] && echo 130 || echo 143)
  [ "$code" -eq "$want" ] || fail "SIG$signal: exit $code, want $want"
  line=$(grep -E "^harness: interrupted at step [0-9]+: .*stopped-$signal.h5 holds [0-9]+ steps" "$WORK/err-$signal")
  [ -n "$line" ] || fail "SIG$signal: no 'interrupted at step K' line: $(cat "$WORK/err-$signal")"
  k=$(echo "$line" | sed -E 's/.*interrupted at step ([0-9]+):.*/\1/')
  held=$(echo "$line" | sed -E 's/.* holds ([0-9]+) steps.*/\1/')
  [ "$k" = "$held" ] || fail "SIG$signal: step $k but $held steps held"
  "$HARNESS" inspect --allow-incomplete --json "$r" >"$WORK/after.json" || fail "SIG$signal: receipt unreadable"
  $PY - "$WORK/after.json" "$k" <<'PY' || fail "SIG$signal: the receipt does not hold the steps the line names"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["complete"] is False and j["steps_recorded"] == int(sys.argv[2]) and 3 <= j["steps_recorded"] < 100, j
PY
  "$HARNESS" validate "$r" >/dev/null || fail "SIG$signal: the interrupted receipt does not validate"
  [ ! -e "$r.lock" ] || fail "SIG$signal: the lock file stayed behind"
done

# The nightly cut by SIGTERM: the lane under way keeps its finished steps, the reports say
# which lane was cut and that the rest never started, exit 143.
mkdir -p "$WORK/no-goldens"
"$HARNESS" nightly --goldens "$WORK/no-goldens" --out "$WORK/cut" >/dev/null 2>"$WORK/cut.err" &
pid=$!
first=$("$PY" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["lanes"][0]["id"])' "$HERE/../../canaries/nightly.toml")
wait_for_steps "$WORK/cut/receipts/$first.h5" 3 || fail "nightly: the first lane's receipt never showed a step"
# (the lane under way when the signal lands may be a later one on a loaded machine)
kill -s TERM "$pid"; wait "$pid"; code=$?
[ "$code" -eq 143 ] || fail "nightly cut by SIGTERM: exit $code, want 143: $(cat "$WORK/cut.err")"
cut=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["interrupted"]["lane"] or "")' "$WORK/cut/summary.json")
# The signal lands inside a lane (the usual case) or, on a loaded machine, between two.
if [ -n "$cut" ]; then
  grep -q "^harness: interrupted in lane $cut (signal 15)" "$WORK/cut.err" || fail "nightly does not say which lane was cut: $(cat "$WORK/cut.err")"
else
  grep -q "^harness: interrupted between lanes, after lane [^ ]* (signal 15)" "$WORK/cut.err" || fail "nightly does not say where it stopped: $(cat "$WORK/cut.err")"
fi
"$PY" - "$WORK/cut/summary.json" <<'PY' || fail "the nightly's reports do not say which lane was cut"
import json, sys
s = json.load(open(sys.argv[1]))
cut = s["interrupted"]
assert cut["signal"] == 15, cut
ids = [l["id"] for l in s["lanes"]]
first = lambda lane: lane["checks"][0]
if cut["lane"] is not None:  # cut inside a lane: it holds the steps it finished
    k = ids.index(cut["lane"])
    assert first(s["lanes"][k])["error"]["kind"] == "interrupted" and "interrupted at step" in first(s["lanes"][k])["error"]["message"]
    finished, later = s["lanes"][:k], s["lanes"][k + 1:]
else:  # between lanes: every lane up to after_lane finished, none after it started
    k = ids.index(cut["after_lane"])
    finished, later = s["lanes"][:k + 1], s["lanes"][k + 1:]
assert all(first(l).get("error", {}).get("kind") != "interrupted" for l in finished)  # finished before the signal
assert later and all("not started" in first(l)["summary"] for l in later), (k, ids)
PY
grep -q "interrupted" "$WORK/cut/report.html" || fail "the HTML report does not show the cut"

# inspect --follow shows a running job's steps live, in order, and ends with the run
f="$WORK/followed.h5"
"$HARNESS" run --canary tiny --steps 40 --out "$f" >/dev/null 2>&1 &
pid=$!
"$HARNESS" inspect --follow --interval 0.05 "$f" >"$WORK/follow.out" 2>"$WORK/follow.err"; code=$?
wait "$pid"
[ "$code" -eq 0 ] || fail "inspect --follow exit $code: $(cat "$WORK/follow.err")"
$PY - "$WORK/follow.out" "$f" <<'PY' || fail "inspect --follow did not show every step as the receipt holds it"
import re, sys, h5py
lines = open(sys.argv[1]).read().splitlines()
steps = [l for l in lines if l.startswith("step ")]
assert [int(l.split()[1]) for l in steps] == list(range(40)), steps[:3]
with h5py.File(sys.argv[2], "r") as r:
    loss = r["steps/loss"][:]
assert all(float(l.split()[3]) == loss[i] for i, l in enumerate(steps))
assert lines[-1] == "complete    40 steps", lines[-1]
PY
# ... and a followed run that is stopped ends the follow with exit 1
s="$WORK/followed-stopped.h5"
"$HARNESS" run --canary tiny --out "$s" >/dev/null 2>&1 &
pid=$!
wait_for_steps "$s" 2 || fail "follow-stop: no step readable"
"$HARNESS" inspect --follow --interval 0.05 "$s" >/dev/null 2>"$WORK/follow.err" &
follower=$!
kill -s TERM "$pid"; wait "$pid"
wait "$follower"; code=$?
[ "$code" -eq 1 ] || fail "follow of a stopped run: exit $code, want 1"
grep -q "the run stopped after [0-9]* of 100 steps" "$WORK/follow.err" || fail "follow does not say where the run stopped: $(cat "$WORK/follow.err")"

# Readers never fail a run: four followers reading as fast as they can while the run ends
# (the writer reopens the file to mark it complete, while a reader may hold HDF5's lock:
# measured 4 failed runs of 15 before the writer waited the lock out).
for i in 1 2 3 4 5 6 7 8; do
  r="$WORK/followed-$i.h5"
  "$HARNESS" run --canary micro --steps 30 --out "$r" >/dev/null 2>"$WORK/busy-run.err" &
  pid=$!
  for k in 1 2 3 4; do "$HARNESS" inspect --follow --interval 0.01 "$r" >/dev/null 2>&1 & done
  wait "$pid"; code=$?
  wait
  [ "$code" -eq 0 ] || fail "a run read by four followers: exit $code: $(tail -n 1 "$WORK/busy-run.err")"
done

# Two writers, one path: the second is refused, with and without --force.
a="$WORK/same.h5"
"$HARNESS" run --canary tiny --out "$a" >/dev/null 2>"$WORK/err-a" &
pid=$!
wait_for_steps "$a" 2 || fail "first writer: no step readable"
expect_exit 2 "same.h5 is being written by process $pid \(.*harness run --canary tiny" -- \
  "$HARNESS" run --canary micro --out "$a" --force
expect_exit 2 "same.h5 is being written by process $pid" -- "$HARNESS" run --canary micro --out "$a"
wait "$pid" || fail "the first writer failed: $(cat "$WORK/err-a")"
"$HARNESS" validate "$a" >/dev/null || fail "the first writer's receipt does not validate"
"$HARNESS" inspect --json "$a" | $PY -c 'import json,sys; j=json.load(sys.stdin); assert j["complete"] and j["steps_recorded"] == 100, j' \
  || fail "the first writer's receipt is not complete"

# The same for a nightly's --out directory and for a goldens directory: while another
# process holds the lock (flock(1) here, the same kernel lock), a second writer is refused
# and touches nothing.
flock "$WORK/busy.lock" sleep 60 &
holder=$!
sleep 0.3
expect_exit 2 "busy is being written by another process" -- "$HARNESS" nightly --goldens "$WORK/no-goldens" --out "$WORK/busy"
[ ! -e "$WORK/busy" ] || fail "a refused nightly made its --out directory"
mkdir -p "$WORK/goldens"
flock "$WORK/goldens.lock" sleep 60 &
golden_holder=$!
sleep 0.3
expect_exit 2 "goldens is being written by another process" -- "$HARNESS" golden approve --goldens "$WORK/goldens" --approved-by x
kill "$holder" "$golden_holder" 2>/dev/null; wait "$holder" "$golden_holder" 2>/dev/null

# A writer killed with SIGKILL holds no lock: the next run of that path goes ahead.
k="$WORK/killed.h5"
"$HARNESS" run --canary tiny --out "$k" >/dev/null 2>&1 &
pid=$!
wait_for_steps "$k" 2 || fail "killed writer: no step readable"
kill -9 "$pid"; wait "$pid" 2>/dev/null
expect_exit 0 "" -- "$HARNESS" run --canary micro --steps 2 --out "$k" --force
finish
