#!/usr/bin/env bash
# The restart gate in the nightly (docs/nightly.md, "The restart gate"): a lane with
# resume-at = K runs again, stops after step K, checkpoints, goes on in a new process and
# must be bitwise the uninterrupted run from K+1. Harness engines' lanes (cpu-ref, accel
# with FP8 scaling histories, tpu-mesh on a mesh) pass through the harness's checkpoints;
# a Python canary's lane through its own save and load: one that saves everything passes,
# one whose save leaves the schedule out fails the job (exit 1) naming lr and the
# omission; a canary without save and load is refused before anything runs (exit 2).
source "$(dirname "$0")/lib.sh"
BUDGETS="$HERE/../../canaries/budgets.toml"
unset CI

# 1. Harness engines: every gated lane passes, its checkpoint the gate's own.
cat >"$WORK/engines.toml" <<'TOML'
schema_version = 1
canary = "micro"
steps = 8
seed = 7
reference = "ref"
[[lanes]]
id = "ref"
engine = "cpu-ref"
resume-at = 3
[[lanes]]
id = "fp8"
engine = "accel"
features = "bf16,fp8=all"
noise-seed = 11
amax-history = 4
resume-at = 4
[[lanes]]
id = "tp"
engine = "tpu-mesh"
mesh = "2x2"
shard-plan = "tp"
resume-at = 0
TOML
"$HARNESS" golden refresh --matrix "$WORK/engines.toml" --goldens "$WORK/g" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$WORK/g" --approved-by test --allow-dirty >/dev/null 2>&1 || fail "goldens"
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/engines.toml" --goldens "$WORK/g" --budgets "$BUDGETS" \
  --out "$WORK/engines"
"$PY" - "$WORK/engines" <<'PY' || fail "the harness lanes' restart gates"
import json, os, sys
out = sys.argv[1]
s = json.load(open(out + "/summary.json"))
for lane, at in (("ref", 3), ("fp8", 4), ("tp", 0)):
    record = next(l for l in s["lanes"] if l["id"] == lane)
    gate = next(c for c in record["checks"] if c["check"] == "resume")
    assert gate["status"] == "pass" and gate["at"] == at, gate
    assert gate["summary"] == f"stopped after step {at}, restarted in a new process: steps {at + 1}-7 bitwise equal", gate
    # the checkpoint the new process resumed from: the start of step K+1 (and 2(K+1), ...)
    saved = sorted(os.listdir(f"{out}/resume/{lane}.h5.ckpt"))
    assert saved[0] == f"step_{at + 1:06d}.h5", saved
PY
grep -q "^Restart gate of \`micro/accel+bf16+fp8=all+amax-history=4\`: .* pass: stopped after step 4" "$WORK/engines/summary.md" ||
  fail "summary.md lacks the fp8 lane's restart gate: $(grep -i restart "$WORK/engines/summary.md")"

# 2. A Python canary (examples/restart-gate/canary.py): one lane, gated after step 2.
mkdir -p "$WORK/py"
cp "$HERE/../../examples/restart-gate/canary.py" "$WORK/py/canary.py"
# The negative control nudges the example's last Linear (op 3): a 1-ulp nudge of element 0
# of its first Linear, the control's default, is absorbed under ATen's AVX2 and AVX-512
# kernels (2026-11-30, a 2-core AMD EPYC of family 25 model 17) and the control says so.
python_matrix() {  # NAME: the canary NAME of the example, its fp32 lane gated at step 2
  cat >"$WORK/py/$1.toml" <<TOML
schema_version = 1
canary = "canary.py:$1"
steps = 5
reference = "fp32"
control-fault = "step=2,op=3,ulps=1"
[[lanes]]
id = "fp32"
engine = "torch"
resume-at = 2
TOML
}
python_matrix everything
python_matrix no_scheduler
python_matrix no_save
sed 's/^resume-at = 2$/precision = "bf16"\nresume-at = 2/' "$WORK/py/everything.toml" >"$WORK/py/bf16.toml"
for name in everything no_scheduler; do  # two canaries (their goldens: each its own)
  "$HARNESS" golden refresh --matrix "$WORK/py/$name.toml" --goldens "$WORK/g-$name" --reason test >/dev/null 2>&1 &&
    "$HARNESS" golden approve --goldens "$WORK/g-$name" --approved-by test --allow-dirty >/dev/null 2>&1 ||
    fail "$name's golden"
done
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/py/everything.toml" --goldens "$WORK/g-everything" --budgets "$BUDGETS" \
  --out "$WORK/everything"
grep -q "^Restart gate of \`resume-demo/torch\`: .* pass: stopped after step 2, restarted in a new process: steps 3-4" \
  "$WORK/everything/summary.md" || fail "summary.md lacks the passing gate: $(grep -i restart "$WORK/everything/summary.md")"
# The same model, its save without the scheduler: its uninterrupted run is its golden, its restart is not.
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$WORK/py/no_scheduler.toml" --goldens "$WORK/g-no_scheduler" --budgets "$BUDGETS" \
  --out "$WORK/no_scheduler"
"$PY" - "$WORK/no_scheduler" <<'PY' || fail "the omitted schedule"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["verdict"] == "fail", s["verdict"]
lane = s["lanes"][0]
checks = {c["check"]: c["status"] for c in lane["checks"]}
assert checks == {"golden": "pass", "resume": "fail"}, checks
gate = next(c for c in lane["checks"] if c["check"] == "resume")
d = gate["first_difference"]
assert d["step"] == 4 and d["what"] == "lr" and "learning-rate schedule" in d["omission"], d
PY
grep -q "resume.*step 4 differs (lr): likely omission: a learning-rate schedule" "$WORK/no_scheduler/summary.md" ||
  fail "summary.md does not name the omission: $(grep -i resume "$WORK/no_scheduler/summary.md")"
grep -q "canary_harness resume-check .*canary.py:no_scheduler --at 2" "$WORK/no_scheduler/report.html" ||
  fail "report.html does not give the gate's command"
expect_exit 2 "no_save.toml: lanes\[0\] \(fp32\)\.resume-at: the canary gives no save and load" -- \
  "$HARNESS" nightly --matrix "$WORK/py/no_save.toml" --goldens "$WORK/g-everything" --budgets "$BUDGETS" --out "$WORK/no_save"
[ ! -e "$WORK/no_save" ] || fail "a refused matrix left $WORK/no_save"
# A bf16 lane is gated in bf16, as it trains (resume-check --precision bf16); a lane on
# another device than the CPU is refused.
"$HARNESS" golden refresh --matrix "$WORK/py/bf16.toml" --goldens "$WORK/g-bf16" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$WORK/g-bf16" --approved-by test --allow-dirty >/dev/null 2>&1 || fail "bf16's golden"
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$WORK/py/bf16.toml" --goldens "$WORK/g-bf16" --budgets "$BUDGETS" \
  --out "$WORK/bf16"
grep -q "^Restart gate of \`resume-demo/torch+bf16\`: .* pass: stopped after step 2, restarted in a new process" \
  "$WORK/bf16/summary.md" || fail "summary.md lacks the bf16 gate: $(grep -i restart "$WORK/bf16/summary.md")"
"$PY" - "$WORK/bf16" <<'PY' || fail "the bf16 gate's command"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
gate = next(c for c in s["lanes"][0]["checks"] if c["check"] == "resume")
assert gate["status"] == "pass" and gate["command"].endswith("--precision bf16"), gate
PY
sed 's/^resume-at = 2$/device = "xla"\nresume-at = 2/' "$WORK/py/everything.toml" >"$WORK/py/xla.toml"
expect_exit 2 "xla.toml: lanes\[0\] \(fp32\)\.resume-at: the gate runs the canary on the CPU" -- \
  "$HARNESS" nightly --matrix "$WORK/py/xla.toml" --goldens "$WORK/g-everything" --budgets "$BUDGETS" --out "$WORK/xla"
[ ! -e "$WORK/xla" ] || fail "a refused matrix left $WORK/xla"
exit $((failures > 0))
