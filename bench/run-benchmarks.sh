#!/usr/bin/env bash
# Runs every benchmark of bench/ in one go, on an otherwise idle machine, and prints the
# numbers docs/performance.md records: GEMM vs OpenBLAS, the non-GEMM kernels, the tiny
# step at 1 and 2 threads with the recording cost, accel's step per feature and noise
# mode (docs/engines/accel.md), tpu-mesh's step and compile cache
# (docs/engines/tpu-mesh.md), the same step in PyTorch, llama-tiny's step beside
# PyTorch's, the scale canary beside tiny with peak memory, and both nightlies per lane.
#   bench/run-benchmarks.sh [OUT_DIR]     (default: a new directory under $TMPDIR)
# Measures the build in build/ as it is (bench/lib.sh; HARNESS_BENCH_BUILD=1 builds it and
# the benchmarks first).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=$(bench_out benchmarks "${1:-}")
bench_harness -DHARNESS_BUILD_BENCH=ON >/dev/null
bench=$root/build/bench
[ -x "$bench/step_bench" ] || { echo "bench: no benchmarks in $bench: configure with -DHARNESS_BUILD_BENCH=ON and build, or rerun with HARNESS_BENCH_BUILD=1" >&2; exit 2; }
for b in gemm_bench kernels_bench step_bench mesh_bench check_bench; do
  min_time=0.5
  [ "$b" = step_bench ] || [ "$b" = mesh_bench ] && min_time=2   # whole steps: longer runs, steadier medians on a shared VM
  "$bench/$b" --benchmark_counters_tabular=true --benchmark_min_time=$min_time \
    --benchmark_out="$out/$b.json" --benchmark_out_format=json | tee "$out/$b.txt"
done
# The harness step time at its best thread count, handed to the PyTorch script for the ratio.
best_ms=$(/usr/bin/python3 - "$out/step_bench.json" <<'PYEOF'
import json, sys
runs = [b for b in json.load(open(sys.argv[1]))["benchmarks"] if b["name"].startswith("BM_TinyTrainStep")]
print(min(b["real_time"] for b in runs))
PYEOF
)
/usr/bin/python3 "$root/bench/torch_step.py" --steps 30 --warmup 5 --json "$out/torch_step.json" --compare-ms "$best_ms" \
  | tee "$out/torch_step.txt"
# Recorder vs bare torch step (issue 14): 300 rounds paired with the bare step, the default inline recorder
/usr/bin/python3 "$root/bench/recorder_overhead.py" --steps 300 --overlap off --json "$out/recorder_overhead.json" | tee "$out/recorder_overhead.txt"
# A Python canary's recording vs its bare step (docs/own-model.md, "Cost"): the example, 200 rounds paired
/usr/bin/python3 "$root/bench/own_model_overhead.py" --rounds 200 --json "$out/own_model_overhead.json" | tee "$out/own_model_overhead.txt"
/usr/bin/python3 "$root/bench/own_model_overhead.py" --canary "$root/examples/own-model/canary.py:small" --rounds 400 \
  --json "$out/own_model_overhead_small.json" | tee "$out/own_model_overhead_small.txt"
/usr/bin/python3 "$root/bench/background_interference.py" --canary "$root/examples/own-model/canary.py:small" \
  --blocks 100 --json "$out/background_interference.json" | tee "$out/background_interference.txt"
# llama-tiny's and moe-tiny's steps beside PyTorch's (docs/performance.md, "The llama-tiny and moe-tiny steps").
for canary in llama-tiny moe-tiny; do
  "$root/bench/canary-step.sh" "$canary" "$out/$canary-step" | tee "$out/${canary//-/_}_step.txt"
done
# The default nightly, lane by lane (docs/performance.md, "The nightly job").
"$root/bench/nightly.sh" "$out/nightly" | tee "$out/nightly.txt"
"$root/bench/nightly.sh" --matrix "$root/canaries/llama-nightly.toml" "$out/llama-nightly" | tee "$out/llama_nightly.txt"
# How the step and its memory grow with the model (docs/performance.md, "Scale").
"$root/bench/scale.sh" "$out/scale" | tee "$out/scale.txt"
"$root/bench/bisect_replay.sh" "$out/bisect" | tee "$out/bisect_replay.txt"
echo "results in $out"
