#!/usr/bin/env bash
# harness calibrate --perturb N (docs/budgets.md, "Perturbation calibration"): the reference's
# own envelope (no proposal), a noise budget proposed from perturbed runs that reduction
# orders it never saw (other noise seeds: bitwise-irrelevant reruns) then pass, the bf16
# lane's drift reported against its envelope, a replayable envelope (same seeds, same
# numbers), one line per repeat saying why, and bad input exit 2 with one line and no file.
source "$(dirname "$0")/lib.sh"
BUDGETS="$WORK/budgets.toml"
cp "$HERE/../../canaries/budgets.toml" "$BUDGETS"
MATRIX="$WORK/matrix.toml"
cat >"$MATRIX" <<'TOML'
schema_version = 1
canary = "micro"
steps = 12
seed = 7
reference = "ref"
[[lanes]]
id = "ref"
engine = "cpu-ref"
[[lanes]]
id = "noise"
engine = "accel"
noise = "seeded"
noise-seed = 11
[[lanes]]
id = "bf16"
engine = "accel"
features = "bf16"
noise-seed = 11
[[lanes]]
id = "torch"
engine = "torch"
device = "cpu"
precision = "fp32"
TOML

# 1. The reference's envelope: nothing to propose, exit 0, the JSON and the report.
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 8 --lane ref --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/ref.toml"
[ ! -e "$WORK/ref.toml" ] || fail "an envelope of the reference wrote a candidate budgets file"
grep -q "Method: perturbation, N = 8 runs of micro/cpu-ref" "$WORK/ref.md" || fail "the report names no method and N"
grep -q "Statistic: per step, the largest |perturbed - unperturbed|" "$WORK/ref.md" || fail "the report names no statistic"
"$PY" - "$WORK/ref.envelope.json" <<'PY' || fail "the reference's envelope"
import json, sys
e = json.load(open(sys.argv[1]))
assert e["method"] == "perturbation" and e["runs"] == 8 and e["seeds"] == list(range(1, 9)) and "drift" not in e
assert all(len(e["spread"][m]) == 12 for m in ("loss", "grad_norm", "params_sketch"))
assert e["spread"]["params_sketch"][0] > 0  # every weight moved: the sketches see it from step 0
assert max(e["spread"]["loss"]) > 0         # and it reaches the loss
PY
# the same seeds give the same envelope (every perturbation is replayable)
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 8 --lane ref --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/again.toml"
"$PY" -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a["spread"]==b["spread"]' \
  "$WORK/ref.envelope.json" "$WORK/again.envelope.json" || fail "two envelopes of the same seeds differ"

# 2. The noise budget from 8 perturbed runs; other reduction orders fall inside it.
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 8 --lane noise --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/noise.toml"
grep -q '^method = "perturbation: the unperturbed run and 8 runs' "$WORK/noise.toml" || fail "the candidate names no method"
grep -q '^samples = 8$' "$WORK/noise.toml" || fail "the candidate does not count the 8 perturbed runs as its samples"
grep -q "within the proposal: 9/9" "$WORK/noise.md" || fail "not every run fits the proposal: $(cat "$WORK/noise.md")"
[ "$(grep -c '^- perturb seed [0-9]*: now .*; proposed pass' "$WORK/noise.md")" -eq 8 ] ||
  fail "not one line per perturbed run: $(cat "$WORK/noise.md")"
"$HARNESS" run --canary micro --steps 12 --seed 7 --out "$WORK/plain.h5" >/dev/null 2>&1 || fail "reference run"
for seed in 1000 1001 1002 1003; do
  "$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --noise seeded --noise-seed $seed \
    --out "$WORK/n$seed.h5" >/dev/null 2>&1 || fail "noise run $seed"
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/n$seed.h5" "$WORK/plain.h5" --budgets "$WORK/noise.toml"
done
! grep -q provisional "$WORK/stdout" || fail "an entry from 8 perturbed runs reads as provisional: $(cat "$WORK/stdout")"

# 3. bf16: its drift against its envelope, per step.
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 3 --provisional --lane bf16 --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/bf16.toml"
grep -q "^samples = 3$" "$WORK/bf16.toml" || fail "the candidate does not count the 3 perturbed runs as its samples"
grep -q "| step | loss envelope | loss drift | ratio |" "$WORK/bf16.md" || fail "no drift against the envelope"
"$PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); assert len(e["drift"]["loss"])==12 and max(e["drift"]["loss"])>0' \
  "$WORK/bf16.envelope.json" || fail "the bf16 envelope has no drift"

# 4. From a receipt: its recipe runs again, perturbed; the same envelope as the lane's.
"$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --noise seeded --noise-seed 11 \
  --out "$WORK/noise11.h5" >/dev/null 2>&1 || fail "noise run 11"
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 8 --receipts "$WORK/noise11.h5" --reference "$WORK/plain.h5" \
  --budgets "$BUDGETS" --out "$WORK/from_receipt.toml"
"$PY" -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a["spread"]==b["spread"] and a["drift"]==b["drift"]' \
  "$WORK/noise.envelope.json" "$WORK/from_receipt.envelope.json" || fail "a receipt's envelope is not its lane's"

# 5. Bad input: one line, exit 2, no candidate.
expect_exit 2 "--perturb: Value 0 not in range 1 to 1000" -- "$HARNESS" calibrate --perturb 0 --lane noise \
  --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/bad.toml"
expect_exit 2 "excludes" -- "$HARNESS" calibrate --perturb 2 --repeats 2 --lane noise --matrix "$MATRIX" \
  --budgets "$BUDGETS" --out "$WORK/bad.toml"
expect_exit 2 "--perturb: give one receipt" -- "$HARNESS" calibrate --perturb 8 --receipts "$WORK/n1000.h5" \
  "$WORK/n1001.h5" --reference "$WORK/plain.h5" --budgets "$BUDGETS" --out "$WORK/bad.toml"
expect_exit 2 "--perturb: lane torch runs a command \(torch\) the harness cannot perturb" -- "$HARNESS" calibrate --perturb 8 --lane torch \
  --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/bad.toml"
expect_exit 2 "--perturb-init: '-1' is not a seed" -- "$HARNESS" run --canary micro --perturb-init -1 --out "$WORK/bad.h5"
[ ! -e "$WORK/bad.toml" ] && [ ! -e "$WORK/bad.h5" ] || fail "a refused calibration or run left a file"
finish
