#!/usr/bin/env bash
# A nightly of a Python canary (docs/own-model.md, "A nightly"): a matrix whose canary is
# FILE.py:NAME runs its torch lanes through `python3 -m canary_harness run`, with no canary
# pack; goldens refreshed and approved from the matrix; a budget calibrated from perturbed
# runs of the bf16 lane, under which the nightly passes, its negative control seen; a failing lane whose report's
# reproduce command, run as printed, makes its receipt again bit for bit; the lanes' detection
# power; bad matrices exit 2 with one line naming the file and key.
source "$(dirname "$0")/lib.sh"
unset CI
SMALL=$(cd "$HERE/../../python/tests/own_canaries" && pwd)/small.py
mkdir -p "$WORK/m" "$WORK/g"
cp "$SMALL" "$WORK/m/small.py"
MATRIX="$WORK/m/nightly.toml"
cat >"$MATRIX" <<'TOML'
schema_version = 1
canary = "small.py:canary"
steps = 4
reference = "fp32"
[[lanes]]
id = "fp32"
engine = "torch"
[[lanes]]
id = "bf16"
engine = "torch"
precision = "bf16"
TOML

expect_exit 0 "" -- "$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$WORK/g" --reason "small: first goldens"
expect_exit 0 "" -- "$HARNESS" golden approve --goldens "$WORK/g" --approved-by "A. Reviewer" --allow-dirty
[ -f "$WORK/g/small/torch.h5" ] && [ -f "$WORK/g/small/torch+bf16.h5" ] || fail "no goldens at small/torch[+bf16]"
expect_exit 0 "" -- "$HARNESS" calibrate --perturb 3 --provisional --lane bf16 --matrix "$MATRIX" --out "$WORK/budgets.toml"
grep -q '^\[small.torch-bf16\]' "$WORK/budgets.toml" || fail "no [small.torch-bf16] proposed"
grep -q "^4 runs of small/torch+bf16 (1 unperturbed, 3 perturbed) against small/torch" "$WORK/budgets.md" ||
  fail "the report does not name the lane's runs: $(head -3 "$WORK/budgets.md")"
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$MATRIX" --goldens "$WORK/g" --budgets "$WORK/budgets.toml" --out "$WORK/ok"
[ ! -e "$WORK/ok/canary-pack.h5" ] || fail "a Python canary's nightly exported a canary pack"
"$PY" - "$WORK/ok/summary.json" <<'PY' || fail "the nightly's lanes"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "pass", s["verdict"]
assert [(l["id"], l["lane"], l["status"]) for l in s["lanes"]] == [("fp32", "small/torch", "pass"), ("bf16", "small/torch+bf16", "pass")]
# the negative control: 1 ulp in the canary's first leaf module at step 2, seen by the golden check and bisect
fault = s["controls"][0]
assert fault["control"] == "fault" and fault["status"] == "seen" and fault["fault"] == "step=2,op=embed,ulps=1", fault
assert fault["summary"].endswith("fails the golden check at step 2; bisect names embed"), fault
# the bf16 lane is judged under an entry from 3 perturbed runs: provisional, in its verdict
budget = {c["check"]: c for c in s["lanes"][1]["checks"]}["reference"]["verdict"]["budget"]
assert budget["provisional"] == ["small.torch-bf16"] and budget["samples"] == {"small.torch-bf16": 3}, budget
PY
grep -q '<strong class="provisional" title="[^"]*">provisional: \[small.torch-bf16\] from 3 samples</strong>' "$WORK/ok/report.html" ||
  fail "report.html does not mark the bf16 lane provisional"
[ "$(grep -o 'class="provisional"' "$WORK/ok/report.html" | wc -l)" -eq 1 ] || fail "report.html marks more than the bf16 lane provisional"

# trace = "ops": the lanes record module op traces, and change no bit (each is bitwise its golden)
sed 's/^reference = "fp32"/reference = "fp32"\ntrace = "ops"/' "$MATRIX" >"$WORK/m/traced.toml"
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/m/traced.toml" --goldens "$WORK/g" --budgets "$WORK/budgets.toml" \
  --out "$WORK/traced"
"$PY" -c 'import h5py,sys; f=h5py.File(sys.argv[1]); assert f["manifest"].attrs["trace"] in (b"ops", "ops") and "trace" in f' \
  "$WORK/traced/receipts/bf16.h5" || fail "a traced Python canary lane wrote no /trace"

# A lane that fails: its report's first command runs it again, bit for bit.
sed 's/atol = [0-9.e-]*/atol = 1e-12/g' "$WORK/budgets.toml" >"$WORK/tight.toml"
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$MATRIX" --goldens "$WORK/g" --budgets "$WORK/tight.toml" --out "$WORK/fail"
again=$("$PY" - "$WORK/fail/report.html" <<'PY'
import html, re, sys
commands = [html.unescape(c) for c in re.findall(r'<pre class="command">(.*?)</pre>', open(sys.argv[1]).read(), re.S)]
print(commands[0])
PY
)
case "$again" in *"-m canary_harness run "*"--precision bf16"*"--out bf16.h5") ;; *) fail "the report's rerun command: $again" ;; esac
(cd "$WORK" && bash -c "$again" >/dev/null 2>&1) || fail "the report's rerun command failed: $again"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/bf16.h5" "$WORK/fail/receipts/bf16.h5"
grep -q "budget      reference (bitwise" "$WORK/stdout" || fail "the rerun is not bitwise the nightly's receipt"

# Detection power of a Python canary's lanes (docs/own-model.md, "What the budget catches"):
# the regressions go in through `python3 -m canary_harness run --inject-fault kind=...`. The
# bitwise reference lane catches the smallest rung of every ladder at its step, in the
# first linear layer's weight (hidden.weight: the embedding's table is not one); a rung run
# by hand as its --json names it fails the golden check at that step.
expect_exit 0 "" -- "$HARNESS" power --lane fp32 --matrix "$MATRIX" --json
"$PY" - "$WORK/stdout" <<'PY' || fail "the reference lane's power"
import json, sys
r = json.load(open(sys.argv[1]))
assert (r["lane"], r["tensor"], r["step"], r["bitwise"], r["too_loose"]) == ("small/torch", "hidden.weight", 1, True, False), r
caught = {l["kind"]: (l["smallest_caught"], l["step"], len(l["rungs"])) for l in r["ladders"]}
assert caught == {"weight-scale": (1e-07, 1, 1), "weight-ulps": (1, 0, 1), "lr-scale": (1e-05, 1, 1),
                  "eps-scale": (10, 0, 1)}, caught
PY
(cd "$WORK/m" && PYTHONPATH="$HERE/../../python" HARNESS_BIN="$HARNESS" "$PY" -m canary_harness run small.py:canary --steps 4 --out "$WORK/lr-rung.h5" \
  --inject-fault kind=lr-scale,step=1,by=1e-05 >/dev/null 2>&1) || fail "the lr-scale rung, run by hand"
expect_exit 1 "" -- "$HARNESS" check "$WORK/lr-rung.h5" --goldens "$WORK/g"
grep -q "first failing step 1" "$WORK/stdout" || fail "the lr-scale rung does not fail its golden check at step 1: $(cat "$WORK/stdout")"
expect_exit 2 "--tensor: nope is not a parameter of small \\(e.g. embed.weight, out.bias\\)" -- \
  "$HARNESS" power --lane fp32 --matrix "$MATRIX" --tensor nope

# A team on torch 2.x: every lane under .venv/'s interpreter (python = PATH), named after its
# release, the fp32 lane the bitwise reference; goldens of their own; the compiled lane
# within a torch-compile budget calibrated from the two.
VENV_PY=$(cd "$HERE/../.." && pwd)/.venv/bin/python
[ -x "$VENV_PY" ] || fail "no .venv/ (scripts/python-env.sh makes it)"
cat >"$WORK/m/torch2.toml" <<TOML
schema_version = 1
canary = "small.py:canary"
steps = 4
reference = "fp32"
[[lanes]]
id = "fp32"
engine = "torch"
python = "$VENV_PY"
[[lanes]]
id = "compiled"
engine = "torch"
python = "$VENV_PY"
compile = true
TOML
expect_exit 0 "" -- "$HARNESS" golden refresh --matrix "$WORK/m/torch2.toml" --goldens "$WORK/g" --reason "small on torch 2.9"
expect_exit 0 "" -- "$HARNESS" golden approve --goldens "$WORK/g" --approved-by "A. Reviewer" --allow-dirty
[ -f "$WORK/g/small/torch@2.9.h5" ] && [ -f "$WORK/g/small/torch@2.9+compile.h5" ] || fail "no goldens at small/torch@2.9[+compile]"
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/g/small/torch@2.9+compile.h5" --reference "$WORK/g/small/torch@2.9.h5" \
  --provisional --out "$WORK/budgets2.toml"
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/m/torch2.toml" --goldens "$WORK/g" --budgets "$WORK/budgets2.toml" \
  --out "$WORK/torch2"
"$PY" - "$WORK/torch2/summary.json" <<'PY' || fail "the torch 2.9 lanes of a Python canary"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "pass", s["verdict"]
assert [(l["id"], l["lane"], l["status"]) for l in s["lanes"]] == \
    [("fp32", "small/torch@2.9", "pass"), ("compiled", "small/torch@2.9+compile", "pass")], s["lanes"]
PY

# Bad matrices: one line naming the file and the key, exit 2.
bad() {
  local pattern=$1 body=$2
  printf 'schema_version = 1\nreference = "fp32"\n%s\n' "$body" >"$WORK/m/bad.toml"
  expect_exit 2 "bad.toml: .*$pattern" -- "$HARNESS" golden status --matrix "$WORK/m/bad.toml" --goldens "$WORK/g"
}
lane='[[lanes]]
id = "fp32"
engine = "torch"'
bad "canary: .*no file" "canary = \"nowhere.py:canary\"
$lane"
bad "canary: .*defines no 'nope'" "canary = \"small.py:nope\"
$lane"
bad "steps: must be an integer in 1..6" "canary = \"small.py:canary\"
steps = 7
$lane"
bad "lanes\[0\] \(fp32\): a Python canary's lanes are engine = \"torch\"" "canary = \"small.py:canary\"
[[lanes]]
id = \"fp32\"
engine = \"cpu-ref\""
bad "lanes\[0\] \(fp32\).threads: '0' is not in 1..1024: torch's CPU threads" "canary = \"small.py:canary\"
$lane
threads = 0"
bad "lanes\[0\] \(fp32\).noise-seed: unknown key of a torch-canary lane" "canary = \"small.py:canary\"
$lane
noise-seed = 3"
bad "trace: 'aten' is not a trace level of a Python canary's lanes \\(aten traces come from bisect's replay\\); use none or ops" "canary = \"small.py:canary\"
trace = \"aten\"
$lane"
finish
