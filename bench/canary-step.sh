#!/usr/bin/env bash
# A shipped canary's training step on cpu-ref beside the same step in PyTorch, in one run
# (docs/performance.md, "The llama-tiny and moe-tiny steps"): step_bench's
# BM_CanaryTrainStep/CANARY at 1 and 2 threads, then the PyTorch lane's step
# (bench/torch_canary_step.py) on the pack `harness export` writes for the same canary, at
# 1 and 2 torch threads, and the ratio of the two best times.
#   bench/canary-step.sh CANARY [OUT_DIR]   CANARY: llama-tiny or moe-tiny (default: a new
#                                           directory under $TMPDIR)
# Measures the build in build/ as it is (bench/lib.sh; HARNESS_BENCH_BUILD=1 builds it and
# the benchmarks first).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
canary=${1:?usage: bench/canary-step.sh CANARY [OUT_DIR]}
out=$(bench_out "$canary-step" "${2:-}")
harness=$(bench_harness -DHARNESS_BUILD_BENCH=ON)
bench=$root/build/bench
[ -x "$bench/step_bench" ] || { echo "bench: no benchmarks in $bench: configure with -DHARNESS_BUILD_BENCH=ON and build, or rerun with HARNESS_BENCH_BUILD=1" >&2; exit 2; }
"$bench/step_bench" --benchmark_filter="BM_CanaryTrainStep/${canary//-/_}/" --benchmark_min_time=2 --benchmark_counters_tabular=true \
  --benchmark_out="$out/step_bench.json" --benchmark_out_format=json | tee "$out/step_bench.txt"
best_ms=$(/usr/bin/python3 - "$out/step_bench.json" <<'PYEOF'
import json, sys
print(min(b["real_time"] for b in json.load(open(sys.argv[1]))["benchmarks"]))
PYEOF
)
"$harness" export --canary "$canary" --steps 40 --out "$out/pack.h5" --force >/dev/null
/usr/bin/python3 "$root/bench/torch_canary_step.py" --pack "$out/pack.h5" --steps 30 --warmup 5 \
  --json "$out/torch_step.json" --compare-ms "$best_ms" | tee "$out/torch_step.txt"
echo "results in $out"
