#!/usr/bin/env bash
# Drift of the accel engine's numerics features from cpu-ref on the tiny canary: for each
# feature and combination, the max and mean |loss - cpu-ref loss| over all steps, and the
# spread between seeded-noise repeats. These numbers seed the per-feature budgets
# (docs/engines/accel.md, "Measured drift").
#   bench/accel-drift.sh [OUT_DIR] [STEPS] [REPEATS]   (defaults: a new directory under $TMPDIR, 100, 3)
# Measures build/bin/harness as built (bench/lib.sh: HARNESS_BIN, HARNESS_BENCH_BUILD=1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
harness=$(bench_harness)
out=$(bench_out accel-drift "${1:-}")
steps=${2:-100}
repeats=${3:-3}

run() {  # run NAME ARGS...: one receipt per lane
  local name=$1; shift
  "$harness" run --canary tiny --steps "$steps" --out "$out/$name.h5" --force "$@" >/dev/null 2>&1
}
run cpu-ref
run fp32+noise=off            --engine accel --noise off
run bf16+noise=off            --engine accel --features bf16 --noise off
for zone in qkv attn_proj mlp_fc mlp_proj all; do
  run "bf16+fp8=$zone+noise=off" --engine accel --features "bf16,fp8=$zone" --noise off
done
run bf16+fp8=all+current+noise=off --engine accel --features bf16,fp8=all --fp8-recipe current --noise off
run bf16+fp8=all+limited+noise=off --engine accel --features bf16,fp8=all --fp8-accumulate limited --noise off
for i in $(seq 1 "$repeats"); do
  run "fp32+seeded.$i"         --engine accel
  run "bf16+seeded.$i"         --engine accel --features bf16
  run "bf16+fp8=all+seeded.$i" --engine accel --features bf16,fp8=all
done

/usr/bin/python3 - "$out" "$steps" <<'PYEOF' | tee "$out/drift.md"
import glob, itertools, os, sys
import h5py, numpy as np
out, steps = sys.argv[1], int(sys.argv[2])
loss = lambda name: h5py.File(os.path.join(out, name + ".h5"), "r")["steps/loss"][:]
ref = loss("cpu-ref")
print(f"tiny, {steps} steps, |loss - cpu-ref loss| per step (noise off: the drift is the numerics alone)\n")
print("| lane features | max | mean | steps 0-9 max | steps 10+ max |")
print("|---|---|---|---|---|")
names = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(out, "*noise=off.h5")))
for name in names:
    d = np.abs(loss(name) - ref)
    print(f"| {name} | {d.max():.2e} | {d.mean():.2e} | {d[:10].max():.2e} | {d[10:].max():.2e} |")
print("\nseeded noise: spread between repeats with different noise seeds, and drift from cpu-ref\n")
print("| lane features | repeats | max spread | mean spread | max drift from cpu-ref |")
print("|---|---|---|---|---|")
for lane in ("fp32+seeded", "bf16+seeded", "bf16+fp8=all+seeded"):
    runs = [loss(os.path.basename(p)[:-3]) for p in sorted(glob.glob(os.path.join(out, lane + ".*.h5")))]
    spread = [np.abs(a - b) for a, b in itertools.combinations(runs, 2)]
    drift = max(np.abs(r - ref).max() for r in runs)
    print(f"| {lane} | {len(runs)} | {max(s.max() for s in spread):.2e} | {np.mean([s.mean() for s in spread]):.2e} | {drift:.2e} |")
PYEOF
