#!/usr/bin/env bash
# Drift of the tpu-mesh engine from cpu-ref on the tiny canary: for every shard plan, mesh
# and precision, the max and mean |loss - cpu-ref loss| over all steps and the largest
# relative L2 difference of the final parameters (all tensors together). fp32 moves only by the order of its
# collectives; bf16 adds bf16 storage. These numbers back the tolerances of
# docs/engines/tpu-mesh.md and seed the mesh-fp32 and mesh-bf16 budgets.
#   bench/mesh-drift.sh [OUT_DIR] [STEPS]   (defaults: a new directory under $TMPDIR, 100)
# Measures build/bin/harness as built (bench/lib.sh: HARNESS_BIN, HARNESS_BENCH_BUILD=1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
harness=$(bench_harness)
out=$(bench_out mesh-drift "${1:-}")
steps=${2:-100}

run() {  # run NAME ARGS...: one receipt per lane, the final parameters dumped
  local name=$1; shift
  "$harness" run --canary tiny --steps "$steps" --dump-tensors "$steps" --out "$out/$name.h5" --force "$@" >/dev/null 2>&1
}
run cpu-ref
for precision in fp32 bf16; do
  for plan in dp tp zero3; do
    for mesh in 1x1 2x1 1x2 2x2 4x1; do
      run "$precision+$plan@$mesh" --engine tpu-mesh --precision "$precision" --shard-plan "$plan" --mesh "$mesh"
    done
  done
done

/usr/bin/python3 - "$out" "$steps" <<'PYEOF' | tee "$out/drift.md"
import os, sys
import h5py, numpy as np
out, steps = sys.argv[1], int(sys.argv[2])
def receipt(name):
    return h5py.File(os.path.join(out, name + ".h5"), "r")
ref = receipt("cpu-ref")
ref_loss = ref["steps/loss"][:]
final = f"tensors/step_{steps:06d}"
print(f"tiny, {steps} steps: |loss - cpu-ref loss| per step, and ||p - p_ref|| / ||p_ref|| over all final parameters\n")
print("| precision | plan | mesh | bitwise cpu-ref | max \\|Δloss\\| | mean \\|Δloss\\| | final params, rel L2 |")
print("|---|---|---|---|---|---|---|")
for precision in ("fp32", "bf16"):
    for plan in ("dp", "tp", "zero3"):
        for mesh in ("1x1", "2x1", "1x2", "2x2", "4x1"):
            r = receipt(f"{precision}+{plan}@{mesh}")
            d = np.abs(r["steps/loss"][:] - ref_loss)
            same = bool((r["hashes/params"][:] == ref["hashes/params"][:]).all() and d.max() == 0)
            diff = sum(float(((r[final][n][:].astype(np.float64) - ref[final][n][:]) ** 2).sum()) for n in ref[final])
            norm = sum(float((ref[final][n][:].astype(np.float64) ** 2).sum()) for n in ref[final])
            rel = (diff / norm) ** 0.5
            print(f"| {precision} | {plan} | {mesh} | {'yes' if same else 'no'} | {d.max():.2e} | {d.mean():.2e} | {rel:.2e} |")
PYEOF
