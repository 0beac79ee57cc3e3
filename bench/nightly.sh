#!/usr/bin/env bash
# Times the default nightly (canaries/nightly.toml, budget: 3 minutes on the 2-core
# development machine), or another lane matrix (canaries/llama-nightly.toml), and prints
# the breakdown per lane: run time, ms per step, and the share of the job, against the
# reference lane's step as the peer within the same run.
#   bench/nightly.sh [--matrix FILE] [OUT_DIR]     (default: a new directory under $TMPDIR)
# Measures build/bin/harness as built (bench/lib.sh: HARNESS_BIN, HARNESS_BENCH_BUILD=1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
matrix=()
if [ "${1:-}" = "--matrix" ]; then
  [ -n "${2:-}" ] || { echo "bench: --matrix needs a lane matrix file" >&2; exit 2; }
  matrix=(--matrix "$2")
  shift 2
fi
harness=$(bench_harness)
out=$(bench_out nightly "${1:-}")
rmdir "$out"  # the nightly makes its own --out directory
start=$(date +%s.%N)
status=0
"$harness" nightly "${matrix[@]}" --out "$out" >/dev/null 2>&1 || status=$?
/usr/bin/python3 - "$out/summary.json" "$start" <<'PYEOF'
import json, sys, time
s = json.load(open(sys.argv[1]))
wall = time.time() - float(sys.argv[2])
lanes = s["lanes"] + s["auxiliary_runs"]
ref = next(l for l in lanes if l["id"] == s["matrix"]["reference"])
print(f"{'lane':<16} {'seconds':>8} {'ms/step':>8} {'x ' + ref['id']:>9} {'share':>6}")
for l in lanes:
    print(f"{l['id']:<16} {l['seconds']:>8.1f} {l['ms_per_step']:>8.1f} {l['ms_per_step'] / ref['ms_per_step']:>9.2f} "
          f"{100 * l['seconds'] / wall:>5.0f}%")
runs = sum(l["seconds"] for l in lanes)
print(f"{'runs':<16} {runs:>8.1f}\n{'checks, reports':<16} {wall - runs:>8.1f}\n{'total (wall)':<16} {wall:>8.1f}   verdict {s['verdict']}")
PYEOF
echo "reports in $out"
exit "$status"
