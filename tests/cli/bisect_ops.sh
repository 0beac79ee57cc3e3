#!/usr/bin/env bash
# The issue's acceptance test, on the tiny canary: on each engine (cpu-ref; accel with
# noise off and with seeded noise; tpu-mesh 2x2 tp) a run with
# --inject-fault step=37,op=blocks.2.attn.proj against a clean run of the same lane, both
# with op traces: bisect reports step 37 and op blocks.2.attn.proj, forward, layer 2.
source "$(dirname "$0")/lib.sh"
FAULT=step=37,op=blocks.2.attn.proj

# bisect_lane NAME FLAGS...: a clean and a faulted run, then bisect
bisect_lane() {
  local name=$1; shift
  for kind in clean fault; do
    local fault=()
    [ "$kind" = fault ] && fault=(--inject-fault "$FAULT")
    "$HARNESS" run --steps 38 --trace ops --out "$WORK/$name-$kind.h5" "${fault[@]}" "$@" >/dev/null 2>&1 ||
      fail "run $name $kind"
  done
  expect_exit 1 "" -- "$HARNESS" bisect "$WORK/$name-fault.h5" "$WORK/$name-clean.h5" --json
  "$PY" - "$WORK/stdout" <<'PY' || fail "bisect $name: $(cat "$WORK/stdout")"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["mode"] == "bitwise" and b["first_divergent_step"] == 37 and b["equal_steps"] == 37, b
op = b["first_divergent_op"]
assert (op["name"], op["phase"], op["layer"]) == ("blocks.2.attn.proj", "forward", 2), op
PY
  expect_exit 1 "" -- "$HARNESS" bisect "$WORK/$name-fault.h5" "$WORK/$name-clean.h5"
  grep -q "^first op    blocks.2.attn.proj forward, layer 2 " "$WORK/stdout" || fail "story of $name: $(cat "$WORK/stdout")"
}

bisect_lane cpu-ref
bisect_lane accel-noise-off --engine accel --noise off
bisect_lane accel-seeded --engine accel --noise-seed 20261121
bisect_lane mesh-tp --engine tpu-mesh --mesh 2x2 --shard-plan tp
finish
