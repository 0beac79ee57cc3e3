#!/usr/bin/env bash
# A clean tree passes: the default matrix (canaries/nightly.toml) against the committed
# goldens under the committed budgets, every lane bit for bit equal to its golden, and the
# goldens directory in order (no lane without a golden, no orphan, every golden logged).
source "$(dirname "$0")/lib.sh"
unset CI
expect_exit 0 "" -- "$HARNESS" golden status
expect_exit 0 "" -- "$HARNESS" nightly --out "$WORK/nightly"
"$PY" - "$WORK/nightly/summary.json" <<'PY' || fail "the default nightly is not a bitwise pass against its goldens"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "pass" and len(s["lanes"]) >= 5
for lane in s["lanes"]:
    golden = next(c for c in lane["checks"] if c["check"] == "golden")
    assert golden["summary"] == "bitwise equal", (lane["id"], golden["summary"])
PY
finish
