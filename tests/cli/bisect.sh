#!/usr/bin/env bash
# harness bisect on every engine: an injected fault at step 5 against a clean run of the
# same lane is found at step 5 with the first tensor that differs and, from the op traces,
# the op the fault hit (blocks.1.mlp.fc forward, layer 1); equal runs are
# equivalent (exit 0); a noisy lane against cpu-ref parts where it leaves its budget;
# different data and step ranges are errors (exit 2, one line) before any bisecting.
source "$(dirname "$0")/lib.sh"
run() { "$HARNESS" run --canary micro --steps 12 --trace ops --force "$@" >/dev/null 2>&1 || fail "run $*"; }
FAULT=step=5,op=blocks.1.mlp.fc

# expect_divergence A B STEP: bisect exits 1 and names STEP, a tensor, the equal steps before it
expect_divergence() {
  expect_exit 1 "" -- "$HARNESS" bisect "$1" "$2" --json
  "$PY" - "$WORK/stdout" "$3" <<'PY' || fail "bisect $1 $2: $(cat "$WORK/stdout")"
import json, sys
b = json.load(open(sys.argv[1]))
step = int(sys.argv[2])
assert b["version"] == 2 and b["verdict"] == "diverged" and b["data"] == "equal" and b["mode"] == "bitwise"
assert b["first_divergent_step"] == step and b["equal_steps"] == step, b
assert b["first_divergent_tensor"]["family"] in ("params", "grads", "adam_m", "adam_v") and b["first_divergent_tensor"]["tensor"]
op = b["first_divergent_op"]
assert b["op_trace"] == "receipts" and b["no_op_reason"] is None, b
assert (op["name"], op["phase"], op["layer"], op["tensor"], op["kind"]) == \
    ("blocks.1.mlp.fc", "forward", 1, "blocks.1.mlp.fc.out", "activation"), op
PY
}

run --out "$WORK/ref.h5"
run --out "$WORK/ref-1t.h5" --threads 1
run --out "$WORK/ref-fault.h5" --inject-fault $FAULT
expect_divergence "$WORK/ref-fault.h5" "$WORK/ref.h5" 5
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/ref-fault.h5" "$WORK/ref.h5"
grep -q "^equal       steps 0-4 bitwise equal$" "$WORK/stdout" || fail "the story lacks the equal steps: $(cat "$WORK/stdout")"
grep -q "^diverges    step 5 differs first in " "$WORK/stdout" || fail "the story lacks the step: $(cat "$WORK/stdout")"
grep -q "^first op    blocks.1.mlp.fc forward, layer 1 (op " "$WORK/stdout" || fail "the story lacks the op: $(cat "$WORK/stdout")"
expect_exit 0 "" -- "$HARNESS" bisect "$WORK/ref-1t.h5" "$WORK/ref.h5"
grep -q "the runs are equivalent" "$WORK/stdout" || fail "equal runs are not called equivalent"

# accel with seeded noise: the same seed replays, so the fault is found bit for bit (bf16
# rounding absorbs a 1-ulp nudge, hence a larger one)
run --out "$WORK/acc.h5" --engine accel --features bf16 --noise-seed 3
run --out "$WORK/acc-fault.h5" --engine accel --features bf16 --noise-seed 3 --inject-fault $FAULT,ulps=100000
expect_divergence "$WORK/acc-fault.h5" "$WORK/acc.h5" 5

# tpu-mesh 2x2 tp
run --out "$WORK/tp.h5" --engine tpu-mesh --mesh 2x2 --shard-plan tp
run --out "$WORK/tp-fault.h5" --engine tpu-mesh --mesh 2x2 --shard-plan tp --inject-fault $FAULT
expect_divergence "$WORK/tp-fault.h5" "$WORK/tp.h5" 5

# a noisy lane against cpu-ref: within its budget it is equivalent; under a 1e-9 bf16 loss
# budget it leaves at step 0 on the loss
expect_exit 0 "" -- "$HARNESS" bisect "$WORK/acc.h5" "$WORK/ref.h5"
set_windows "$HERE/../../canaries/budgets.toml" bf16 loss '[ { steps = "0-", atol = 1e-9 } ]' "$WORK/tight.toml"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/acc.h5" "$WORK/ref.h5" --budgets "$WORK/tight.toml" --json
"$PY" - "$WORK/stdout" <<'PY' || fail "the budgeted bisect is wrong: $(cat "$WORK/stdout")"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["mode"] == "budget" and b["budget"] == ["bf16", "noise"]
assert b["first_divergent_step"] == 0 and b["first_divergent_metric"] == "loss"
assert b["deviation"] > b["allowed"] > 0
PY

# the data contract first: a batch hash changed is "different data", not a divergence
cp "$WORK/ref.h5" "$WORK/other-data.h5"
"$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    h = f['steps/batch_hash'][...]
    h[3] = h[3] + 1
    f['steps/batch_hash'][...] = h
" "$WORK/other-data.h5"
expect_exit 2 "batch" -- "$HARNESS" bisect "$WORK/other-data.h5" "$WORK/ref.h5"
"$HARNESS" run --canary micro --steps 10 --out "$WORK/short.h5" >/dev/null 2>&1
expect_exit 2 "step" -- "$HARNESS" bisect "$WORK/short.h5" "$WORK/ref.h5"
expect_exit 2 "" -- "$HARNESS" bisect "$WORK/nope.h5" "$WORK/ref.h5"
finish
