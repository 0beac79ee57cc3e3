#!/usr/bin/env bash
# harness triage (docs/triage.md): the page run as written, then its exit codes on micro:
# 0 found or nothing to triage, 1 no set of units explains the drift, 2 bad input with one
# line, and the JSON's own consistency.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")  # the page runs from the repository root
script=$WORK/page.sh
page_script "$repo/docs/triage.md" "$harness" "$script"
mkdir -p "$WORK/bin" && ln -s "$PY" "$WORK/bin/python3"  # the page's python3: Debian's, with python3-torch
(cd "$repo" && PATH="$WORK/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
  fail "a command of docs/triage.md failed: $(tail -5 "$WORK/page.out")"
grep -q '^culprits    fp8 at mlp_fc@1 (1 of 16 units): in bf16, the lane passes$' "$WORK/page.out" ||
  fail "the page's saturated unit is not the one named: $(cat "$WORK/page.out")"
[ "$(grep -c '^verdict     FOUND$' "$WORK/page.out")" -eq 2 ] || fail "the page's triages did not both find their unit"
grep -q '^culprits    bf16 at h.1.mlp.c_fc (1 of 13 units): in fp32, the lane passes$' "$WORK/page.out" ||
  fail "the regressed example's broken layer is not the one named: $(cat "$WORK/page.out")"

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
