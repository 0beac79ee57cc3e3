#!/usr/bin/env bash
# Emulation against reality: the accel engine's bf16 drift from cpu-ref beside PyTorch's
# real bf16 autocast drift, on the tiny canary, one initialisation seed, per metric (loss,
# grad_norm, params sketch distance as `harness compare` computes it) and per step window.
# Receipts, logs, `harness compare --json` verdicts, the Markdown table
# (emulation-vs-reality.md) and JSON (emulation-vs-reality.json) go to OUT_DIR; nothing is
# written into the checkout. The helper bench/emulation_vs_reality.py also judges torch bf16
# under the emulation's own budget (accel's bf16 + noise entries) with a copy of the budgets
# file in OUT_DIR.
#   bench/emulation-vs-reality.sh [OUT_DIR] [STEPS] [REPEATS]
#     (defaults: a new directory under $TMPDIR, 100, 3)
# Lanes, all at 1 thread (the machine is shared; each lane's bits are thread-count
# independent except torch's, which the lane pins to 1 thread anyway):
#   cpu-ref                           harness run --canary tiny
#   accel-bf16+noise=off              harness run --engine accel --features bf16 --noise off
#   accel-bf16+seed=100i (REPEATS)    the same, seeded noise with --noise-seed 1001, 1002, ...
#   torch-fp32, torch-bf16            python3 -m canary_harness.lane on `harness export`'s pack
# The headline accel lane is --noise off: it is bitwise repeatable (as CPU torch is at a fixed
# thread count), so the table is reproducible and the accel number is bf16 rounding alone on
# top of a fixed fp32 summation order. The seeded repeats give the spread one bf16 run has
# from another reduction order alone: the noise floor any single-run comparison must be read
# against (docs/engines/accel.md, "Emulation against reality").
# Measures build/bin/harness as built (bench/lib.sh: HARNESS_BIN, HARNESS_BENCH_BUILD=1);
# PYTHON (default /usr/bin/python3) needs torch, h5py and numpy.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
harness=$(bench_harness)
out=$(bench_out emulation-vs-reality "${1:-}")
steps=${2:-100}
repeats=${3:-3}
python=${PYTHON:-/usr/bin/python3}
threads=1

timings="$out/timings.tsv"
: >"$timings"
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
step() {  # step NAME COMMAND...: run it, its output to NAME.log, its wall time to timings.tsv
  local name=$1; shift
  local t0=$EPOCHREALTIME rc=0
  "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    echo "emulation-vs-reality: '$name' failed (exit $rc); see $out/$name.log" >&2
    tail -n 5 "$out/$name.log" >&2
    exit 1
  fi
  printf '%s\t%s\n' "$name" "$(seconds_since "$t0")" >>"$timings"
}
run() {  # run NAME ARGS...: one harness receipt
  local name=$1; shift
  step "$name" "$harness" run --canary tiny --steps "$steps" --threads "$threads" --out "$out/$name.h5" --force "$@"
}
lane() {  # lane NAME PRECISION: one PyTorch lane receipt from the pack
  step "$1" env PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$python" -m canary_harness.lane \
    --pack "$out/pack.h5" --canary tiny --device cpu --precision "$2" --threads "$threads" --out "$out/$1.h5" --force
}

start=$EPOCHREALTIME
run cpu-ref
run accel-bf16+noise=off --engine accel --features bf16 --noise off
for i in $(seq 1 "$repeats"); do
  run "accel-bf16+seed=$((1000 + i))" --engine accel --features bf16 --noise seeded --noise-seed $((1000 + i))
done
step export "$harness" export --canary tiny --steps "$steps" --out "$out/pack.h5" --force
lane torch-fp32 fp32
lane torch-bf16 bf16
# The verdicts of the harness itself, for the record (and for the helper's cross-check of
# the worst deviations): exit 1 is a failing verdict, not an error.
for pair in "accel-bf16+noise=off cpu-ref" "torch-bf16 torch-fp32" "torch-bf16 cpu-ref" "torch-fp32 cpu-ref"; do
  read -r a b <<<"$pair"
  rc=0
  "$harness" compare "$out/$a.h5" "$out/$b.h5" --json >"$out/compare.$a.vs.$b.json" 2>"$out/compare.$a.vs.$b.err" || rc=$?
  if [ "$rc" -gt 1 ]; then echo "emulation-vs-reality: harness compare $a $b: exit $rc" >&2; cat "$out/compare.$a.vs.$b.err" >&2; exit 1; fi
done
seconds=$(seconds_since "$start")

"$python" "$root/bench/emulation_vs_reality.py" --dir "$out" --json "$out/emulation-vs-reality.json" \
  --seconds "$seconds" --harness "$harness" --budgets "$root/canaries/budgets.toml" | tee "$out/emulation-vs-reality.md"
echo "results: $out" >&2
