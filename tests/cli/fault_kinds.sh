#!/usr/bin/env bash
# The regressions --inject-fault injects (docs/canary.md, "Regressions"): each kind moves
# micro from its step and not before, on cpu-ref and on tpu-mesh 2x2 tp; the learning rate
# recorded shows lr-scale from its step exactly; a faulted run replays bitwise, from a
# checkpoint before or after the fault's step; a bad spec exits 2 with one line.
source "$(dirname "$0")/lib.sh"
W=blocks.0.attn.qkv.weight
run() { "$HARNESS" run --canary micro --steps 12 --seed 7 --out "$@" >/dev/null 2>&1 || fail "run $*"; }
run "$WORK/clean.h5"
run "$WORK/clean-tp.h5" --engine tpu-mesh --mesh 2x2 --shard-plan tp
# kind spec : the first step loss or grad_norm differ (=K), or not before (>K: one ulp of a
# weight may be absorbed for a while) : the step the hashes first differ
for given in "kind=weight-scale,step=4,tensor=$W,by=1e-3:=4:4" "kind=weight-ulps,tensor=$W,ulps=1:>0:0" \
             "kind=lr-scale,step=5,by=1e-3:=6:5" "kind=eps-scale,by=10:=1:0"; do
  IFS=: read -r spec scalars hashes <<<"$given"
  for engine in cpu-ref tp; do
    flags=() && against=clean.h5
    [ "$engine" = tp ] && flags=(--engine tpu-mesh --mesh 2x2 --shard-plan tp) && against=clean-tp.h5
    run "$WORK/f.h5" --force "${flags[@]}" --inject-fault "$spec" --checkpoint-every 3
    expect_exit 1 "" -- "$HARNESS" compare "$WORK/f.h5" "$WORK/$against" --json
    "$PY" - "$WORK/stdout" "$scalars" "$hashes" <<'PY' || fail "$spec on $engine moved the run elsewhere than from its step"
import json, sys
v = json.load(open(sys.argv[1]))
first = {m["metric"]: m["first_failing_step"] for m in v["metrics"]}
assert first["hashes"] == int(sys.argv[3]), first
scalars = min(s for s in (first["loss"], first["grad_norm"]) if s is not None)
want = int(sys.argv[2][1:])
assert scalars == want if sys.argv[2][0] == "=" else scalars >= want, first
PY
    for from in 0 6; do
      expect_exit 0 "" -- "$HARNESS" replay "$WORK/f.h5" --from $from
    done
  done
done
# lr-scale: the recorded learning rate is the clean one until step 5, then it times 1.001
run "$WORK/lr.h5" --inject-fault "kind=lr-scale,step=5,by=1e-3"
"$PY" - "$WORK/clean.h5" "$WORK/lr.h5" <<'PY' || fail "the recorded lr does not show lr-scale from its step"
import sys, h5py, numpy as np
clean, faulted = (h5py.File(p, "r")["/steps/lr"][()] for p in sys.argv[1:])
assert (clean[:5] == faulted[:5]).all(), (clean, faulted)
want = (clean[5:].astype(np.float64) * 1.001).astype(np.float32)  # the schedule's fp32 lr, near enough
assert np.allclose(faulted[5:], want, rtol=2e-7, atol=0) and (faulted[5:] != clean[5:]).all(), (faulted, want)
PY
# bad specs: exit 2, one line naming the field, no receipt
for bad in "kind=lr-scale,step=1:lr-scale needs by=" "kind=eps-scale,by=0:by='0' is not a factor > 0" \
           "kind=weight-ulps,tensor=blocks.0.nope,ulps=1:unknown parameter 'blocks.0.nope'" \
           "kind=lr-scale,step=12,by=0.1:step=12 is past the last step" "kind=tilt,by=1:kind='tilt' is not a fault kind"; do
  expect_exit 2 "--inject-fault: .*${bad#*:}" -- "$HARNESS" run --canary micro --steps 12 --inject-fault "${bad%%:*}" \
    --out "$WORK/bad.h5"
  [ ! -e "$WORK/bad.h5" ] || fail "a refused fault ($bad) left a receipt"
done
finish
