#!/usr/bin/env bash
# A clean tree passes: the default matrix (canaries/nightly.toml) against the committed
# goldens under the committed budgets, every lane bit for bit equal to its golden (a real
# stack's lane on another platform than its golden's: within that feature's
# across_platforms budget and nothing else), and the goldens directory in order (no lane
# without a golden, no orphan, every golden logged).
source "$(dirname "$0")/lib.sh"
unset CI
expect_exit 0 "" -- "$HARNESS" golden status
expect_exit 0 "" -- "$HARNESS" nightly --out "$WORK/nightly"
"$PY" - "$WORK/nightly/summary.json" "$HERE/../../canaries/budgets.toml" <<'PY' || fail "the default nightly is not a bitwise pass against its goldens"
import json, sys, tomllib
s = json.load(open(sys.argv[1]))
budgets = tomllib.load(open(sys.argv[2], "rb"))
across = {e["across_platforms"] for e in budgets.values() if isinstance(e, dict) and "across_platforms" in e}
assert s["verdict"] == "pass" and len(s["lanes"]) >= 5
for lane in s["lanes"]:
    golden = next(c for c in lane["checks"] if c["check"] == "golden")
    if golden["summary"] != "bitwise equal":
        features = golden["verdict"]["budget"]["features"]
        assert features and set(features) <= across and golden["status"] == "pass", (lane["id"], golden["summary"], features)
PY
finish
