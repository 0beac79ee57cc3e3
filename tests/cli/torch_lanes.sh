#!/usr/bin/env bash
# Real-stack lanes in the nightly (docs/nightly.md, "External lanes"): a torch lane (one
# process, and two under layout = "ddp") and a command lane run on the job's canary pack, are validated and checked against their
# goldens and the reference; a failing command is the lane's run error naming its last
# stderr line; bad keys exit 2; compare of the torch lanes against cpu-ref passes under
# their declared budgets, and the bf16 lane fails under the fp32 one.
source "$(dirname "$0")/lib.sh"
BUDGETS="$HERE/../../canaries/budgets.toml"
SRC=$(cd "$HERE/../.." && pwd)
G="$WORK/goldens"
mkdir -p "$G"
unset CI
"$PY" -c "import torch" 2>/dev/null || { echo "FAIL: $PY has no torch (the torch lanes need it)" >&2; exit 1; }

header() {
  printf 'schema_version = 1\ncanary = "tiny"\nsteps = 20\nseed = 1337\nreference = "cpu-ref"\n\n'
  printf '[[lanes]]\nid = "cpu-ref"\nengine = "cpu-ref"\n\n'
}
M="$WORK/matrix.toml"
{
  header
  printf '[[lanes]]\nid = "torch-fp32"\nengine = "torch"\ndevice = "cpu"\n\n'
  printf '[[lanes]]\nid = "torch-ddp"\nengine = "torch"\nlayout = "ddp"\n\n'
  printf '[[lanes]]\nid = "cmd-bf16"\nlane = "tiny/torch+bf16"\nbudget-features = "torch-bf16"\n'
  printf 'command = ["/usr/bin/env", "PYTHONPATH=%s/python", "%s", "-m", "canary_harness.lane", "--pack", "{pack}", "--precision", "bf16", "--out", "{out}", "--steps", "{steps}"]\n' "$SRC" "$PY"
} > "$M"
nightly() { "$HARNESS" nightly --matrix "$1" --goldens "$G" --budgets "$BUDGETS" --threads 1 --out "$2"; }

# goldens of the external lanes: refresh runs them through the same code, approve keeps them
expect_exit 0 "" -- "$HARNESS" golden refresh --matrix "$M" --goldens "$G" --reason "torch lanes test"
[ "$(find "$G" -name '*.candidate.h5' | wc -l)" -eq 4 ] || fail "refresh did not write 4 candidates"
expect_exit 0 "" -- "$HARNESS" golden approve --goldens "$G" --approved-by test --allow-dirty

# the job: one pack, every lane validated and judged against its golden and cpu-ref
expect_exit 0 "" -- nightly "$M" "$WORK/run"
[ -s "$WORK/run/canary-pack.h5" ] || fail "the nightly exported no canary pack into its output directory"
"$PY" - "$WORK/run" <<'PY' || fail "the external lanes are not judged like any lane"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["verdict"] == "pass", s["verdict"]
lanes = {l["id"]: l for l in s["lanes"]}
assert lanes["torch-fp32"]["lane"] == "tiny/torch" and lanes["torch-fp32"]["engine"] == "torch"
assert lanes["cmd-bf16"]["lane"] == "tiny/torch+bf16" and lanes["cmd-bf16"]["engine"] == "command"
assert lanes["torch-ddp"]["lane"] == "tiny/torch+ddp"  # layout = "ddp": two processes over gloo
for id, features in (("torch-fp32", ["torch-cpu"]), ("cmd-bf16", ["torch-bf16"]), ("torch-ddp", ["torch-cpu", "torch-ddp"])):
    checks = {c["check"]: c for c in lanes[id]["checks"]}
    assert checks["golden"]["status"] == "pass" and checks["golden"]["verdict"]["budget"]["bitwise"] is True, checks["golden"]
    ref = checks["reference"]
    assert ref["status"] == "pass" and not ref["verdict"]["budget"]["bitwise"], ref
    assert ref["verdict"]["budget"]["features"] == features, ref["verdict"]["budget"]
PY

# compare: fp32 under torch-cpu, bf16 under torch-bf16; bf16 under the fp32 numbers fails
R="$WORK/run/receipts"
expect_exit 0 "" -- "$HARNESS" compare "$R/torch-fp32.h5" "$R/cpu-ref.h5" --budgets "$BUDGETS"
expect_exit 0 "" -- "$HARNESS" compare "$R/cmd-bf16.h5" "$R/cpu-ref.h5" --budgets "$BUDGETS"
"$PY" - "$BUDGETS" "$WORK/fp32-numbers.toml" <<'PY' || fail "cannot write the swapped budgets"
import re, sys
text = open(sys.argv[1]).read()
def section(name):
    return re.search(r"^\[" + re.escape(name) + r"\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
cpu = section("torch-cpu").group(1)
bf16 = section("torch-bf16")
numbers = "\n".join(l for l in cpu.splitlines() if l.startswith(("loss", "grad_norm", "params_sketch")))
kept = "\n".join(l for l in bf16.group(1).splitlines() if not l.startswith(("loss", "grad_norm", "params_sketch")))
open(sys.argv[2], "w").write(text[:bf16.start(1)] + kept + "\n" + numbers + "\n\n" + text[bf16.end(1):])
PY
expect_exit 1 "" -- "$HARNESS" compare "$R/cmd-bf16.h5" "$R/cpu-ref.h5" --budgets "$WORK/fp32-numbers.toml"
grep -qE "^verdict +FAIL" "$WORK/stdout" && grep -qE "^FAIL +loss" "$WORK/stdout" || fail "compare under the fp32 numbers does not say what fails: $(cat "$WORK/stdout")"

# a failing lane with no recipe (a command lane): the report's "run it again" command is the
# nightly of that lane alone, and it runs as printed (the reference beside it)
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$M" --goldens "$G" --budgets "$WORK/fp32-numbers.toml" --threads 1 \
  --out "$WORK/regressed"
again=$("$PY" - "$WORK/regressed/report.html" <<'PY'
import html, re, sys
page = open(sys.argv[1]).read()
section = page[page.index('id="lane-cmd-bf16"'):]
print(html.unescape(re.search(r'<pre class="command">(.*?)</pre>', section, re.S).group(1)))
PY
)
case "$again" in "harness nightly --matrix "*" --lanes cmd-bf16 --out cmd-bf16-again") ;; *) fail "the rerun command: $again" ;; esac
absolute=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")
(cd "$WORK" && eval "\"$absolute\"${again#harness}" >/dev/null 2>&1); [ $? -eq 1 ] || fail "the report's rerun command did not fail the lane again: $again"
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); assert [l["id"] for l in s["lanes"]] == ["cmd-bf16"], s["lanes"]' \
  "$WORK/cmd-bf16-again/summary.json" || fail "the rerun did not run the one lane"
expect_exit 2 "--lanes: 'nope' is not a lane of" -- "$HARNESS" nightly --matrix "$M" --goldens "$G" --lanes nope --out "$WORK/nope"
[ ! -e "$WORK/nope" ] || fail "a refused --lanes made the output directory"

# a command that fails: the lane's run error names the lane, the status and its last stderr line
F="$WORK/failing.toml"
{
  header
  printf '[[lanes]]\nid = "broken"\nbudget-features = "torch-cpu"\n'
  printf 'command = ["/bin/sh", "-c", "echo starting >&2; echo \\"boom: no stack here\\" >&2; exit 3", "{out}"]\n'
} > "$F"
expect_exit 2 "" -- nightly "$F" "$WORK/failing"
"$PY" - "$WORK/failing" <<'PY' || fail "a failing command is not the lane's run error with its last stderr line"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
lane = {l["id"]: l for l in s["lanes"]}["broken"]
run = lane["checks"][0]
assert lane["status"] == "error" and run["check"] == "run" and run["status"] == "error", lane
msg = run["error"]["message"]
assert msg.startswith("lane broken: `/bin/sh -c ") and "exited with status 3: " in msg, msg
assert msg.split("exited with status 3: ")[1] == "boom: no stack here", msg  # the last line, not the first
PY
[ ! -e "$WORK/failing/receipts/broken.h5" ] && [ ! -e "$WORK/failing/receipts/broken.h5.partial" ] || fail "a failed lane left a receipt"

# a command whose receipt declares other budget features than the matrix: the lane's error
D="$WORK/declares.toml"
{
  header
  printf '[[lanes]]\nid = "liar"\nlane = "tiny/torch"\nbudget-features = "torch-bf16"\n'
  printf 'command = ["/usr/bin/env", "PYTHONPATH=%s/python", "%s", "-m", "canary_harness.lane", "--pack", "{pack}", "--out", "{out}"]\n' "$SRC" "$PY"
} > "$D"
expect_exit 2 "" -- nightly "$D" "$WORK/declares"
grep -q "declares budget features 'torch-cpu'; the matrix declares 'torch-bf16'" "$WORK/declares/summary.json" ||
  fail "a budget-features mismatch is not named"

# bad keys: exit 2, one line naming the file and the key
bad() { { header; printf '[[lanes]]\nid = "x"\n%b' "$1"; } > "$WORK/bad.toml"
        expect_exit 2 "bad.toml: lanes\[1\] \(x\)\.$2" -- nightly "$WORK/bad.toml" "$WORK/bad-$RANDOM"; }
bad 'command = ["tool", "{out}"]\n' "budget-features: missing"
bad 'command = ["tool", "{out}", "{where}"]\nbudget-features = "a"\n' "command\[2\]: '\{where\}' is not a placeholder"
bad 'command = ["tool"]\nbudget-features = "a"\n' "command: no argument holds \{out\}"
bad 'engine = "torch"\nprecision = "fp16"\n' "precision: 'fp16' is not fp32 or bf16"
bad 'engine = "torch"\nmesh = "2x2"\n' "mesh: unknown key of a torch-pack lane"
bad 'engine = "accel"\nbudget-features = "bf16"\n' "budget-features: only an external lane"
# llama-tiny's torch lane against cpu-ref under its own entry of the shipped budgets
# ([llama-tiny.torch-cpu]: llama-tiny is not among the canaries the default entries budget).
"$HARNESS" run --canary llama-tiny --steps 6 --out "$WORK/llama-ref.h5" >/dev/null 2>&1 || fail "llama-tiny cpu-ref run"
"$HARNESS" export --canary llama-tiny --steps 6 --out "$WORK/llama-pack.h5" >/dev/null 2>&1 || fail "llama-tiny export"
env PYTHONPATH="$SRC/python" HARNESS_BIN="$HARNESS" "$PY" -m canary_harness.lane --pack "$WORK/llama-pack.h5" --out "$WORK/llama-torch.h5" \
  >/dev/null 2>&1 || fail "llama-tiny torch lane"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/llama-torch.h5" "$WORK/llama-ref.h5"
grep -q "budget      llama-tiny.torch-cpu" "$WORK/stdout" || fail "compare of llama-tiny's torch lane: $(cat "$WORK/stdout")"
finish
