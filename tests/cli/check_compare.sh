#!/usr/bin/env bash
# harness check and compare from the command line: exit 0 on a pass, 1 naming the first
# failing step of an injected fault, 2 with one line for every receipt or budgets file that
# cannot be used (a receipt or golden that declares no budget_features, a declared feature
# with no budget entry); budgets keyed per canary; --json carries the documented keys; a
# golden is never written to.
source "$(dirname "$0")/lib.sh"
BUDGETS="$HERE/../../canaries/budgets.toml"
G="$WORK/goldens"
mkdir -p "$G/micro"
run() { "$HARNESS" run --canary micro --force "$@" >/dev/null 2>&1 || fail "run $*"; }

run --steps 8 --out "$G/micro/cpu-ref.h5"
run --steps 8 --out "$WORK/clean.h5" --threads 1
run --steps 8 --out "$WORK/fault.h5" --inject-fault step=5,op=blocks.1.mlp.fc
run --out "$WORK/short.h5" --steps 6
run --steps 8 --out "$WORK/mesh.h5" --engine tpu-mesh --mesh 2x1 --shard-plan zero3
golden_sum=$(sha256sum "$G/micro/cpu-ref.h5")

# clean: bitwise equal to its golden
expect_exit 0 "" -- "$HARNESS" check "$WORK/clean.h5" --goldens "$G" --budgets "$BUDGETS"
grep -q "budget      reference (bitwise" "$WORK/stdout" || fail "check does not say it was bitwise: $(cat "$WORK/stdout")"
# a fault: exit 1, the step named
expect_exit 1 "" -- "$HARNESS" check "$WORK/fault.h5" --goldens "$G" --budgets "$BUDGETS"
grep -q "FAIL  hashes .*first failing step 5" "$WORK/stdout" || fail "fault step not named: $(cat "$WORK/stdout")"
"$HARNESS" check "$WORK/fault.h5" --goldens "$G" --budgets "$BUDGETS" --json > "$WORK/fault.json"
[ $? -eq 1 ] || fail "check --json of the fault did not exit 1"
"$PY" - "$WORK/fault.json" <<'PY' || fail "check --json lacks the documented keys"
import json, sys
v = json.load(open(sys.argv[1]))
assert v["version"] == 1 and v["kind"] == "golden" and v["verdict"] == "fail"
assert v["first_failing_step"] == 5 and v["budget"]["bitwise"] is True
assert v["first_moved"]["step"] == 5 and v["data"] == "equal"
for m in v["metrics"]:
    assert set(m) >= {"metric", "pass", "first_failing_step", "worst_step", "max_deviation", "allowed",
                      "headroom_pct", "failing_steps", "allowed_outliers", "worst_tensor", "step_deviation",
                      "step_allowed"}
    assert len(m["step_deviation"]) == len(m["step_allowed"]) == v["steps"]
hashes = next(m for m in v["metrics"] if m["metric"] == "hashes")
assert hashes["step_deviation"][5] > 0 and hashes["step_deviation"][:5] == [0] * 5
assert any(d["key"] == "fault_injection" for d in v["stack_diff"])
PY
# compare across lanes: the composed budget
expect_exit 0 "" -- "$HARNESS" compare "$WORK/mesh.h5" "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
grep -q "budget      mesh-fp32" "$WORK/stdout" || fail "compare does not name mesh-fp32: $(cat "$WORK/stdout")"
# stack lines: what both sides have and differ in; the engine's own settings counted, listed with --verbose
grep -q "^stack       engine: tpu-mesh -> cpu-ref$" "$WORK/stdout" || fail "compare does not show the engine line: $(cat "$WORK/stdout")"
grep -q "(absent)" "$WORK/stdout" && fail "compare lists one-sided settings without --verbose: $(cat "$WORK/stdout")"
grep -qE "^stack       [0-9]+ settings only one side has \(.*mesh.*\); --verbose shows them$" "$WORK/stdout" \
  || fail "compare does not count the one-sided settings: $(cat "$WORK/stdout")"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/mesh.h5" "$G/micro/cpu-ref.h5" --budgets "$BUDGETS" --verbose
grep -q "^stack       mesh: 2x1 -> (absent)$" "$WORK/stdout" || fail "compare --verbose does not list them: $(cat "$WORK/stdout")"

# receipts that cannot be compared, files that cannot be used: exit 2, one line
# a missing golden: advice that leads somewhere (a micro lane is in no matrix: no refresh to suggest)
mkdir -p "$WORK/no-goldens"
expect_exit 2 "no golden for lane micro/tpu-mesh@2x1\+zero3 .*is not in the nightly matrix .*--golden FILE" -- \
  "$HARNESS" check "$WORK/mesh.h5" --goldens "$WORK/no-goldens" --budgets "$BUDGETS"
expect_exit 2 "has 6 steps and .* has 8; compare receipts of the same --steps" -- \
  "$HARNESS" check "$WORK/short.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
expect_exit 2 "no golden for lane micro/tpu-mesh@2x1\+zero3 at .*micro/tpu-mesh@2x1\+zero3.h5" -- \
  "$HARNESS" check "$WORK/mesh.h5" --goldens "$G" --budgets "$BUDGETS"
expect_exit 2 "is the golden of lane micro/cpu-ref, not micro/tpu-mesh@2x1\+zero3; use .harness compare." -- \
  "$HARNESS" check "$WORK/mesh.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
head -c 4000 "$G/micro/cpu-ref.h5" > "$WORK/corrupt.h5"
expect_exit 2 "corrupt.h5" -- "$HARNESS" check "$WORK/clean.h5" --golden "$WORK/corrupt.h5" --budgets "$BUDGETS"
set_windows "$BUDGETS" bf16 loss '[ { steps = "0-9", atol = 1e-3 }, { steps = "10-", atol = "big" } ]' "$WORK/bad_budgets.toml"
expect_exit 2 "bad_budgets.toml: \[bf16\].loss\[1\].atol: must be a non-negative number" -- \
  "$HARNESS" check "$WORK/clean.h5" --goldens "$G" --budgets "$WORK/bad_budgets.toml"
"$HARNESS" compare "$WORK/short.h5" "$WORK/clean.h5" --budgets "$BUDGETS" --json > "$WORK/error.json" 2>/dev/null
[ $? -eq 2 ] || fail "compare --json of a step-range mismatch did not exit 2"
"$PY" -c "import json,sys; e=json.load(open(sys.argv[1])); assert e['verdict']=='error' and e['error']['kind']=='step_range'" \
  "$WORK/error.json" || fail "the error JSON does not name step_range"

# Budget features are declared, never guessed (docs/budgets.md): every run declares them
"$PY" -c 'import sys, h5py
with h5py.File(sys.argv[1], "r") as f: assert f["manifest"].attrs["budget_features"] in (b"mesh-fp32", "mesh-fp32")' \
  "$WORK/mesh.h5" || fail "the tpu-mesh receipt does not declare mesh-fp32"
# with_declaration SRC DST VALUE: a copy of SRC whose /manifest budget_features is VALUE
# (a fixed-length string, as the schema wants), or absent with VALUE --none.
with_declaration() {
  cp "$1" "$2"
  "$PY" - "$2" "$3" <<'PY' || fail "cannot rewrite budget_features of $2"
import sys, h5py
path, value = sys.argv[1], sys.argv[2]
with h5py.File(path, "r+") as f:
    attrs = f["manifest"].attrs
    del attrs["budget_features"]
    if value != "--none":
        attrs.create("budget_features", value, dtype=h5py.string_dtype("utf-8", max(1, len(value.encode()))))
PY
}
# a receipt that declares nothing (one recorded before the declarations): exit 2, re-record it
with_declaration "$WORK/clean.h5" "$WORK/undeclared.h5" --none
expect_exit 2 "undeclared.h5: the receipt declares no budget_features in /manifest \(docs/budgets.md\); re-record it" -- \
  "$HARNESS" check "$WORK/undeclared.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
# ... a golden that declares nothing: the line says how to re-record and approve it
mkdir -p "$WORK/old_goldens/micro"
with_declaration "$G/micro/cpu-ref.h5" "$WORK/old_goldens/micro/cpu-ref.h5" --none
expect_exit 2 "old_goldens/micro/cpu-ref.h5: the golden of lane micro/cpu-ref declares no budget_features .*re-record it: .harness golden refresh --lanes micro/cpu-ref --reason TEXT., then approve it" -- \
  "$HARNESS" check "$WORK/clean.h5" --goldens "$WORK/old_goldens" --budgets "$BUDGETS"
"$HARNESS" check "$WORK/clean.h5" --goldens "$WORK/old_goldens" --budgets "$BUDGETS" --json > "$WORK/undeclared.json" 2>/dev/null
[ $? -eq 2 ] || fail "check --json of an undeclared golden did not exit 2"
"$PY" -c "import json,sys; e=json.load(open(sys.argv[1])); assert e['verdict']=='error' and e['error']['kind']=='no_budget_features'" \
  "$WORK/undeclared.json" || fail "the error JSON does not name no_budget_features"
# a declared feature with no budget entry: exit 2, never a bitwise comparison (the numbers are cpu-ref's own)
with_declaration "$WORK/clean.h5" "$WORK/torch.h5" torch-fp64
expect_exit 2 "^harness: error: no budget for feature 'torch-fp64' in .*canaries/budgets.toml: calibrate one$" -- \
  "$HARNESS" compare "$WORK/torch.h5" "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
# ... given an entry, the same receipt is judged under it, whatever its engine
{ cat "$BUDGETS"; printf '\n[torch-fp64]\nform = "tolerance"\nrationale = "a test"\ncalibrated = "2026-11-22"\nloss = [ { steps = "0-", atol = 1e-6 } ]\n'; } \
  > "$WORK/torch_budgets.toml"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/torch.h5" "$G/micro/cpu-ref.h5" --budgets "$WORK/torch_budgets.toml"
grep -q "budget      torch-fp64" "$WORK/stdout" || fail "compare does not name torch-fp64: $(cat "$WORK/stdout")"
# a malformed declaration is a schema problem, named
with_declaration "$WORK/clean.h5" "$WORK/twice.h5" noise+bf16+noise
expect_exit 2 "twice.h5: /manifest/budget_features: 'noise\+bf16\+noise' names feature 'noise' twice" -- \
  "$HARNESS" check "$WORK/twice.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
# budgets keyed per canary: [micro.mesh-fp32] over [mesh-fp32] for micro; its keys are checked as any
{ cat "$BUDGETS"; printf '\n[micro.mesh-fp32]\nform = "tolerance"\nrationale = "micro"\ncalibrated = "2026-11-22"\nloss = [ { steps = "0-", atol = 1e-5 } ]\ngrad_norm = [ { steps = "0-", rtol = 1e-4 } ]\nparams_sketch = [ { steps = "0-", atol = 1e-3, rtol = 1e-4 } ]\n'; } \
  > "$WORK/micro_budgets.toml"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/mesh.h5" "$G/micro/cpu-ref.h5" --budgets "$WORK/micro_budgets.toml"
grep -q "budget      micro.mesh-fp32" "$WORK/stdout" || fail "compare does not name micro.mesh-fp32: $(cat "$WORK/stdout")"
sed 's/atol = 1e-5/atol = -1e-5/' "$WORK/micro_budgets.toml" > "$WORK/bad_micro_budgets.toml"
expect_exit 2 "bad_micro_budgets.toml: \[micro.mesh-fp32\].loss\[0\].atol: must be a non-negative number" -- \
  "$HARNESS" compare "$WORK/mesh.h5" "$G/micro/cpu-ref.h5" --budgets "$WORK/bad_micro_budgets.toml"

# BF16-first triage (harness/check/bf16_first.h): an fp8 lane failing a window tightened to
# nothing is explained by its bf16-only twin, which passes: fp8's own drift. A twin that
# declares fp8 itself, or triage of a lane without fp8, is one line and exit 2.
run --steps 8 --out "$WORK/fp8.h5" --engine accel --features bf16,fp8=all
run --steps 8 --out "$WORK/bf16.h5" --engine accel --features bf16
"$PY" - "$BUDGETS" "$WORK/tight_fp8.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
head = text.index("\n[fp8]\n")
end = text.index("\n[", head + 1)
section = re.sub(r"^loss = .*$", 'loss = [ { steps = "0-", atol = 1e-12 } ]', text[head:end], flags=re.M)
open(sys.argv[2], "w").write(text[:head] + section + text[end:])
PY
expect_exit 1 "" -- "$HARNESS" compare "$WORK/fp8.h5" "$G/micro/cpu-ref.h5" --budgets "$WORK/tight_fp8.toml" \
  --triage-with "$WORK/bf16.h5"
grep -q "^triage      quantisation drift: only the fp8 lane moves; the bf16-only lane micro/accel+bf16 passes" \
  "$WORK/stdout" || fail "no BF16-first triage: $(cat "$WORK/stdout")"
expect_exit 2 "fp8.h5 declares fp8 itself; give the bf16-only lane" -- "$HARNESS" compare "$WORK/fp8.h5" \
  "$G/micro/cpu-ref.h5" --budgets "$WORK/tight_fp8.toml" --triage-with "$WORK/fp8.h5"
expect_exit 2 "declares no budget feature triage explains" -- "$HARNESS" compare "$WORK/bf16.h5" "$G/micro/cpu-ref.h5" \
  --budgets "$WORK/tight_fp8.toml" --triage-with "$WORK/bf16.h5"

[ "$(sha256sum "$G/micro/cpu-ref.h5")" = "$golden_sum" ] || fail "a check wrote to the golden"
finish
