#!/usr/bin/env bash
# One-sided drift in the nightly (docs/nightly.md, "One-sided drift"): a lane with
# bias-repeats = N runs under N noise seeds and its repeats are tested against the
# reference lane. The check's counts and p-values equal an independent computation from
# the repeats' receipts; a biased window warns (exit 0, junit passes) by default and fails
# (exit 1) where the entry says bias = "fail"; every repeat replays bit for bit; a matrix
# that asks for repeats a lane cannot give is refused (exit 2, one line naming the key).
source "$(dirname "$0")/lib.sh"
BUDGETS="$HERE/../../canaries/budgets.toml"
G="$WORK/goldens"
unset CI
# micro_nightly.toml with bias-repeats = 8 on its bf16 lane
awk '{print} /^noise-seed = 11$/ && !done {print "bias-repeats = 8"; done=1}' "$HERE/data/micro_nightly.toml" > "$WORK/m.toml"
grep -q "^bias-repeats = 8" "$WORK/m.toml" || fail "the matrix has no bias-repeats"
"$HARNESS" golden refresh --matrix "$WORK/m.toml" --goldens "$G" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$G" --approved-by test --allow-dirty >/dev/null 2>&1 || fail "goldens"

# 1. The default: a warning. The job passes, the console and summary.md say it.
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/m.toml" --goldens "$G" --budgets "$BUDGETS" --out "$WORK/warn"
grep -qE "^  warn +bf16 +bias check: biased" "$WORK/stdout" || fail "no warn line on the console: $(cat "$WORK/stdout")"
grep -q "One-sided drift of \`micro/accel+bf16\`: 🔶 warn" "$WORK/warn/summary.md" || fail "summary.md lacks the bias line"
"$PY" - "$WORK/warn" "$BUDGETS" <<'PY' || fail "the bias check disagrees with an independent computation"
import json, math, sys, tomllib, xml.etree.ElementTree as ET
import h5py
out = sys.argv[1]
s = json.load(open(out + "/summary.json"))
lane = next(l for l in s["lanes"] if l["id"] == "bf16")
assert lane["status"] == "pass", lane["status"]
check = next(c for c in lane["checks"] if c["check"] == "bias")
assert check["status"] == "warn" and check["seeds"] == list(range(11, 19)), (check["status"], check["seeds"])
assert len(check["receipts"]) == 8 and check["bias_fails"] is None
def loss(path):
    with h5py.File(path if path.startswith("/") else out + "/" + path) as f:
        return [float(x) for x in f["steps/loss"][:]]
ref = loss(next(l for l in s["lanes"] if l["id"] == "ref")["receipt"])
runs = [loss(p) for p in check["receipts"]]
for path, seed in zip(check["receipts"], check["seeds"]):  # each repeat records its own seed
    with h5py.File(path if path.startswith("/") else out + "/" + path) as f:
        recipe = json.loads(f["manifest"].attrs["run_options"])
    assert recipe["engine_options"]["noise-seed"] == str(seed), (path, recipe["engine_options"])
# the windows: [bf16]'s loss windows (micro uses the default entries)
windows = tomllib.load(open(sys.argv[2], "rb"))["bf16"]["loss"]
assert len(check["windows"]) == len(windows), (check["windows"], windows)
def p_sign(a, b):
    n, k = a + b, min(a, b)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
biased_any = False
for w, got in zip(windows, check["windows"]):
    first, _, last = w["steps"].partition("-")
    first, last = int(first), int(last) if last else len(ref) - 1
    assert (got["first_step"], got["last_step"] if got["last_step"] is not None else len(ref) - 1) == (first, last), got
    means = [sum(r[i] - ref[i] for i in range(first, last + 1)) / (last - first + 1) for r in runs]
    above, below = sum(m > 0 for m in means), sum(m < 0 for m in means)
    assert (got["above"], got["below"]) == (above, below), (got, above, below)
    assert math.isclose(got["mean"], sum(means) / len(means), rel_tol=1e-9, abs_tol=1e-15), (got["mean"], means)
    assert math.isclose(got["p_sign"], p_sign(above, below), rel_tol=1e-9), (got["p_sign"], p_sign(above, below))
    level = 0.01 / (2 * len(windows))  # Bonferroni over the windows and both tests
    assert got["biased"] == (min(got["p_sign"], got["p_mean"]) < level), got
    biased_any |= got["biased"]
assert biased_any, check["windows"]
root = ET.parse(out + "/junit.xml").getroot()
case = root.find(".//testcase[@classname='nightly.bf16'][@name='bias']")
assert case is not None and case.find("failure") is None and case.find("error") is None, ET.tostring(case)
assert "biased" in case.find("system-out").text
PY

# 2. Every repeat is replayable: its receipt replays bit for bit.
repeat=$(ls "$WORK/warn/bias/"bf16-*.h5 | head -1)
expect_exit 0 "" -- "$HARNESS" replay "$repeat"

# Sharded: the bf16 lane's shard runs its repeats; the merged summary finds them.
for shard in 0 1; do
  expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/m.toml" --goldens "$G" --budgets "$BUDGETS" --shard $shard/2 \
    --out "$WORK/s$shard"
done
expect_exit 0 "" -- "$HARNESS" merge "$WORK/s0" "$WORK/s1" --out "$WORK/merged"
"$PY" - "$WORK/merged" "$WORK/warn" <<'PY' || fail "the merged bias check differs from one run's, or lost its receipts"
import json, os, sys
def bias(out):
    s = json.load(open(out + "/summary.json"))
    return next(c for l in s["lanes"] for c in l["checks"] if c["check"] == "bias")
merged, one = bias(sys.argv[1]), bias(sys.argv[2])
assert (merged["status"], merged["windows"]) == (one["status"], one["windows"]), (merged["status"], one["status"])
assert all(os.path.isfile(os.path.join(sys.argv[1], p)) for p in merged["receipts"]), merged["receipts"]
PY

# 3. bias = "fail" in [bf16]: the lane and the job fail, junit says why.
awk '{print} /^\[bf16\]$/ {print "bias = \"fail\""}' "$BUDGETS" > "$WORK/fail.toml"
grep -A1 '^\[bf16\]$' "$WORK/fail.toml" | grep -q 'bias = "fail"' || fail "the budgets do not say bias = fail"
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$WORK/m.toml" --goldens "$G" --budgets "$WORK/fail.toml" --out "$WORK/fail"
"$PY" - "$WORK/fail" <<'PY' || fail "bias = fail does not fail the lane"
import json, sys, xml.etree.ElementTree as ET
s = json.load(open(sys.argv[1] + "/summary.json"))
lane = next(l for l in s["lanes"] if l["id"] == "bf16")
check = next(c for c in lane["checks"] if c["check"] == "bias")
assert s["verdict"] == "fail" and lane["status"] == "fail" and check["status"] == "fail", (s["verdict"], lane["status"])
assert check["bias_fails"] == "bf16" and '[bf16] says bias = "fail"' in check["summary"], check["summary"]
case = ET.parse(sys.argv[1] + "/junit.xml").getroot().find(".//testcase[@classname='nightly.bf16'][@name='bias']")
assert case.find("failure") is not None, ET.tostring(case)
PY

# 4. Repeats a lane cannot give: exit 2, one line naming the key, nothing run.
bad() {  # bad NAME AWK-PROGRAM PATTERN: the matrix edited by the program is refused
  awk "$2" "$HERE/data/micro_nightly.toml" > "$WORK/$1.toml"
  cmp -s "$WORK/$1.toml" "$HERE/data/micro_nightly.toml" && fail "$1: the matrix was not edited"
  expect_exit 2 "$3" -- "$HARNESS" nightly --matrix "$WORK/$1.toml" --goldens "$G" --budgets "$BUDGETS" --out "$WORK/$1"
  [ ! -e "$WORK/$1/summary.json" ] || fail "$1: a refused matrix wrote a summary"
}
bad reference '/^reference = / {print "reference = \"bf16\""; next} {print} /^noise-seed = 11$/ && !done {print "bias-repeats = 8"; done=1}' \
  'lanes \(bf16\)\.bias-repeats: the reference lane is what the repeats are judged against'
bad fixed '{print} /^id = "tp"$/ {print "bias-repeats = 8"}' 'lanes\[3\] \(tp\)\.bias-repeats: engine tpu-mesh sums in a fixed order'
bad unseeded '/^noise-seed = 11$/ && !done {print "bias-repeats = 8"; done=1; next} {print}' \
  'lanes\[1\] \(bf16\)\.bias-repeats: set the lane.s noise-seed'
bad few '{print} /^noise-seed = 11$/ && !done {print "bias-repeats = 2"; done=1}' 'bias-repeats: must be an integer in 3\.\.100'
bad text '{print} /^noise-seed = 11$/ && !done {print "bias-repeats = \"8\""; done=1}' 'bias-repeats: must be an integer'
finish
