#!/usr/bin/env bash
# harness check and compare from the command line: exit 0 on a pass, 1 naming the first
# failing step of an injected fault, 2 with one line for every receipt or budgets file that
# cannot be used; --json carries the documented keys; a golden is never written to.
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
                      "headroom_pct", "failing_steps", "allowed_outliers", "worst_tensor"}
assert any(d["key"] == "fault_injection" for d in v["stack_diff"])
PY
# compare across lanes: the composed budget
expect_exit 0 "" -- "$HARNESS" compare "$WORK/mesh.h5" "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
grep -q "budget      mesh-fp32" "$WORK/stdout" || fail "compare does not name mesh-fp32: $(cat "$WORK/stdout")"

# receipts that cannot be compared, files that cannot be used: exit 2, one line
expect_exit 2 "has 6 steps and .* has 8; compare receipts of the same --steps" -- \
  "$HARNESS" check "$WORK/short.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
expect_exit 2 "no golden for lane micro/tpu-mesh@2x1\+zero3 at .*micro/tpu-mesh@2x1\+zero3.h5" -- \
  "$HARNESS" check "$WORK/mesh.h5" --goldens "$G" --budgets "$BUDGETS"
expect_exit 2 "is the golden of lane micro/cpu-ref, not micro/tpu-mesh@2x1\+zero3; use .harness compare." -- \
  "$HARNESS" check "$WORK/mesh.h5" --golden "$G/micro/cpu-ref.h5" --budgets "$BUDGETS"
head -c 4000 "$G/micro/cpu-ref.h5" > "$WORK/corrupt.h5"
expect_exit 2 "corrupt.h5" -- "$HARNESS" check "$WORK/clean.h5" --golden "$WORK/corrupt.h5" --budgets "$BUDGETS"
sed 's/atol = 2.2e-3/atol = "big"/' "$BUDGETS" > "$WORK/bad_budgets.toml"
expect_exit 2 "bad_budgets.toml: \[bf16\].loss\[1\].atol: must be a non-negative number" -- \
  "$HARNESS" check "$WORK/clean.h5" --goldens "$G" --budgets "$WORK/bad_budgets.toml"
"$HARNESS" compare "$WORK/short.h5" "$WORK/clean.h5" --budgets "$BUDGETS" --json > "$WORK/error.json" 2>/dev/null
[ $? -eq 2 ] || fail "compare --json of a step-range mismatch did not exit 2"
"$PY" -c "import json,sys; e=json.load(open(sys.argv[1])); assert e['verdict']=='error' and e['error']['kind']=='step_range'" \
  "$WORK/error.json" || fail "the error JSON does not name step_range"

[ "$(sha256sum "$G/micro/cpu-ref.h5")" = "$golden_sum" ] || fail "a check wrote to the golden"
finish
