#!/usr/bin/env bash
# harness triage's exit codes on micro: 0 found or nothing to triage, 1 no set of units
# explains the drift, 2 bad input with one line, and the JSON's own consistency. The page,
# docs/triage.md, runs in cli.triage_doc.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)

run() { "$HARNESS" run --canary micro --steps 20 --threads 2 "$@" >/dev/null 2>&1 || fail "harness run $*"; }
run --out "$WORK/ref.h5"
run --engine accel --features bf16,fp8=all --fp8-saturate mlp_proj@1 --out "$WORK/sat.h5"
"$HARNESS" triage "$WORK/sat.h5" "$WORK/ref.h5" --json >"$WORK/triage.json" || fail "triage --json did not exit 0"
"$PY" - "$WORK/triage.json" <<'PY' || fail "the triage JSON is not consistent"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["status"] == "found" and t["format"] == "fp8" and t["flag"] == "fp8-off", t
assert [c["unit"] for c in t["culprits"]] == ["mlp_proj@1"], t["culprits"]
assert t["culprits"][0] == {"unit": "mlp_proj@1", "group": "mlp_proj", "layer": 1}, t["culprits"]
assert t["headroom_before_pct"] < 0 < t["headroom_after_pct"], t
assert t["trials"][0]["what"] == "fp8 off: every unit (8)" and t["trials"][0]["pass"], t["trials"][0]
final = [x for x in t["trials"] if x["switched"] == ["--fp8-off", "mlp_proj@1"]]
assert len(final) == 1 and final[0]["pass"], t["trials"]
assert final[0]["least_headroom_pct"] == t["headroom_after_pct"], t
assert t["rerun"][:2] == ["harness", "run"] and "--fp8-off" in t["rerun"], t["rerun"]
PY

# Nothing to triage: exit 0, no run.
run --engine accel --features bf16,fp8=all --out "$WORK/good.h5"
expect_exit 0 "" -- "$HARNESS" triage "$WORK/good.h5" "$WORK/ref.h5"
grep -q '^verdict     PASS: the lane is inside its budget; nothing to triage$' "$WORK/stdout" ||
  fail "a passing lane: $(cat "$WORK/stdout")"

# A bf16 lane judged by a bitwise bf16 budget: no GEMM unit in fp32 brings it back (its
# elementwise ops store bf16): NOT FOUND, exit 1.
"$PY" - "$repo/canaries/budgets.toml" "$WORK/tight.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r"\n\[bf16\]\n.*?(?=\n\[)", '\n[bf16]\nform = "bitwise"\nrationale = "triage.sh"\n', text, flags=re.S)
open(sys.argv[2], "w").write(text)
PY
run --engine accel --features bf16 --out "$WORK/bf16.h5"
expect_exit 1 "" -- "$HARNESS" triage "$WORK/bf16.h5" "$WORK/ref.h5" --budgets "$WORK/tight.toml"
grep -q '^trial       bf16 off: every unit (8) ' "$WORK/stdout" ||
  fail "bf16 units were not all switched: $(cat "$WORK/stdout")"
grep -q '^verdict     NOT FOUND: ' "$WORK/stdout" || fail "not NOT FOUND: $(cat "$WORK/stdout")"

# Bad input: one line, exit 2.
expect_exit 2 "no-such.h5" -- "$HARNESS" triage "$WORK/no-such.h5" "$WORK/ref.h5"
run --engine accel --out "$WORK/fp32.h5"
"$PY" - "$repo/canaries/budgets.toml" "$WORK/bitwise-noise.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r"\n\[noise\]\n.*?(?=\n\[)", '\n[noise]\nform = "bitwise"\nrationale = "triage.sh"\n', text, flags=re.S)
open(sys.argv[2], "w").write(text)
PY
expect_exit 2 "runs in no reduced precision" -- \
  "$HARNESS" triage "$WORK/fp32.h5" "$WORK/ref.h5" --budgets "$WORK/bitwise-noise.toml"
"$HARNESS" run --canary tiny --steps 20 --out "$WORK/tiny.h5" >/dev/null 2>&1
expect_exit 2 "ran different canaries" -- "$HARNESS" triage "$WORK/sat.h5" "$WORK/tiny.h5"
expect_exit 2 "--threads" -- "$HARNESS" triage "$WORK/sat.h5" "$WORK/ref.h5" --threads -1
finish
