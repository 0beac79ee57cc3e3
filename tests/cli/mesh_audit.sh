#!/usr/bin/env bash
# harness audit: a clean canary exits 0 and names no finding; --leak-scalars exits 1 and
# names the leaked scalar, the op that reads it and both values; --json says the same.
source "$(dirname "$0")/lib.sh"

# expect_report CODE PATTERN -- command...: exit status CODE, stdout matching PATTERN.
expect_report() {
  local code=$1 pattern=$2; shift 3
  "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  local got=$?
  [ "$got" -eq "$code" ] || { fail "exit $got (want $code): $*; stderr: $(cat "$WORK/stderr")"; return; }
  grep -qF -- "$pattern" "$WORK/stdout" || fail "stdout of '$*' lacks '$pattern': $(cat "$WORK/stdout")"
}

expect_report 0 "clean       no graph breaks" -- "$HARNESS" audit --canary micro --engine tpu-mesh --mesh 2x2 --shard-plan tp
expect_report 0 "clean       no graph breaks" -- "$HARNESS" audit --canary micro --engine tpu-mesh --mesh 2x1 --shard-plan zero3
expect_report 1 "constant \`lr\` is baked into the graph and varies: 0.00075 at step 0, 0.0015 at step 1; op \`wte\` (adamw) reads it" \
  -- "$HARNESS" audit --canary micro --engine tpu-mesh --leak-scalars

json="$WORK/audit.json"
"$HARNESS" audit --canary micro --engine tpu-mesh --leak-scalars --json > "$json"
[ $? -eq 1 ] || fail "leaky audit --json did not exit 1"
"$PY" - "$json" <<'PY' || fail "audit --json does not name the leak"
import json, sys
report = json.load(open(sys.argv[1]))
assert report["clean"] is False
[finding] = report["findings"]
assert finding["kind"] == "varying_constant" and finding["tensor"] == "lr" and finding["op"] == "wte"
assert finding["values"][0] != finding["values"][1]
fingerprints = [step["graphs"][0]["fingerprint"] for step in report["steps"]]
assert len(set(fingerprints)) == 2, fingerprints
PY
finish
