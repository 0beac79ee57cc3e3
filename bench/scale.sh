#!/usr/bin/env bash
# How the cost of a training step grows with the model: the tiny canary and the scale
# canary (gpt2 at C=512, L=8, T=256; canaries/scale.toml) on cpu-ref beside the same step
# in PyTorch, in one run (docs/performance.md, "Scale"). For each canary:
#   - cpu-ref's step, from step_bench (BM_TinyTrainStep, BM_ScaleTrainStep) at 1 and 2 threads;
#   - PyTorch's step on the pack `harness export` writes for the same canary
#     (bench/torch_canary_step.py) at 1 and 2 torch threads;
#   - the peak resident memory of each: `harness run` of a few steps on 2 threads (receipt
#     included), and the PyTorch step's process (with its runtime's share before the model);
# then one table with the ratio of the two best step times.
#   bench/scale.sh [OUT_DIR]     (default: a new directory under $TMPDIR)
# Measures the build in build/ as it is (bench/lib.sh; HARNESS_BENCH_BUILD=1 builds it and
# the benchmarks first). About 3 minutes on 2 cores, most of it the scale canary.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=$(bench_out scale "${1:-}")
harness=$(bench_harness -DHARNESS_BUILD_BENCH=ON)
bench=$root/build/bench
[ -x "$bench/step_bench" ] || { echo "bench: no benchmarks in $bench: configure with -DHARNESS_BUILD_BENCH=ON and build, or rerun with HARNESS_BENCH_BUILD=1" >&2; exit 2; }

# canary, step_bench benchmark, timed torch steps
cases=("tiny BM_TinyTrainStep 30" "scale BM_ScaleTrainStep 3")
for c in "${cases[@]}"; do
  set -- $c
  canary=$1 benchmark=$2 torch_steps=$3
  "$bench/step_bench" --benchmark_filter="^$benchmark/" --benchmark_min_time=2 --benchmark_counters_tabular=true \
    --benchmark_out="$out/$canary-step_bench.json" --benchmark_out_format=json | tee "$out/$canary-step_bench.txt"
  # Peak memory of a real run: the harness as a user runs it, a few steps on 2 threads.
  /usr/bin/python3 - "$harness" "$canary" "$out" >"$out/$canary-harness-memory.json" <<'PYEOF'
import json, resource, subprocess, sys
harness, canary, out = sys.argv[1:]
subprocess.run([harness, "run", "--canary", canary, "--steps", "3", "--threads", "2", "--force",
                "--out", f"{out}/{canary}-memory.h5"], check=True, stdout=subprocess.DEVNULL)
print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
PYEOF
  "$harness" export --canary "$canary" --steps 10 --out "$out/$canary-pack.h5" --force >/dev/null
  /usr/bin/python3 "$root/bench/torch_canary_step.py" --pack "$out/$canary-pack.h5" --steps "$torch_steps" --warmup 1 \
    --memory --json "$out/$canary-torch_step.json" | tee "$out/$canary-torch_step.txt"
done

/usr/bin/python3 - "$out" "${cases[@]}" <<'PYEOF' | tee "$out/summary.md"
import json, sys
out, cases = sys.argv[1], [c.split()[0] for c in sys.argv[2:]]
print("| canary | cpu-ref best ms/step | PyTorch best ms/step | ratio | cpu-ref peak RSS | PyTorch peak RSS (runtime before the model) |")
print("|---|---|---|---|---|---|")
for canary in cases:
    bench = json.load(open(f"{out}/{canary}-step_bench.json"))["benchmarks"]
    harness_ms = min(b["real_time"] for b in bench)
    harness_threads = min(bench, key=lambda b: b["real_time"])["name"].split("/")[1]  # BM_X/THREADS/real_time
    torch = json.load(open(f"{out}/{canary}-torch_step.json"))
    memory = json.load(open(f"{out}/{canary}-harness-memory.json"))
    print(f"| {canary} | {harness_ms:.1f} ({harness_threads} threads) | {torch['best_ms']:.1f} ({torch['best_threads']} "
          f"threads) | {harness_ms / torch['best_ms']:.2f}x | {memory['peak_rss_mib']:.0f} MiB | "
          f"{torch['peak_rss_mib']:.0f} MiB ({torch['baseline_rss_mib']:.0f} MiB) |")
PYEOF
echo "results in $out"
