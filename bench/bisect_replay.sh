#!/usr/bin/env bash
# Costs of the bisect workflow on the tiny canary (100 steps), each engine lane of the
# issue: op tracing (ms per step and receipt bytes, traced against untraced), bisect of two
# traced receipts, bisect with a replay of an untraced side, and replay from the
# checkpoint at step 90 against the whole run (the peer: the same 100 steps run again).
#   bench/bisect_replay.sh [WORK_DIR]   (default: a new directory under $TMPDIR)
# Measures build/bin/harness as built (bench/lib.sh: HARNESS_BIN, HARNESS_BENCH_BUILD=1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
H=$(bench_harness)
work=$(bench_out bisect-replay "${1:-}")
seconds() { local s=$EPOCHREALTIME; "$@" >/dev/null 2>&1 || true; awk -v a="$s" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }'; }
calc() { awk "BEGIN { print $1 }"; }
fault=step=37,op=blocks.2.attn.proj

printf '%-24s %9s %9s %9s %9s\n' lane "ms/step" "traced" "MB" "traced MB"
for lane in "cpu-ref:" "accel:--engine accel --noise-seed 20261121" "tpu-mesh-2x2-tp:--engine tpu-mesh --mesh 2x2 --shard-plan tp"; do
  name=${lane%%:*}; flags=${lane#*:}
  plain=$(seconds "$H" run $flags --out "$work/$name.h5" --force)
  traced=$(seconds "$H" run $flags --trace ops --out "$work/$name-traced.h5" --force)
  printf '%-24s %9.1f %9.1f %9.2f %9.2f\n' "$name" "$(calc "$plain * 10")" "$(calc "$traced * 10")" \
    "$(calc "$(stat -c %s "$work/$name.h5") / 1000000")" "$(calc "$(stat -c %s "$work/$name-traced.h5") / 1000000")"
done

"$H" run --trace ops --inject-fault $fault --out "$work/fault-traced.h5" --force >/dev/null 2>&1
"$H" run --checkpoint-every 10 --inject-fault $fault --out "$work/fault-ckpt.h5" --force >/dev/null 2>&1
echo
printf '%-52s %8s\n' "operation (tiny cpu-ref, 100 steps)" seconds
printf '%-52s %8.3f\n' "bisect, both traced" "$(seconds "$H" bisect "$work/fault-traced.h5" "$work/cpu-ref-traced.h5")"
printf '%-52s %8.3f\n' "bisect, A untraced: replay from checkpoint 30 to 37" \
  "$(seconds "$H" bisect "$work/fault-ckpt.h5" "$work/cpu-ref-traced.h5")"
printf '%-52s %8.3f\n' "replay --from 90 (checkpoint 90: 10 steps)" "$(seconds "$H" replay "$work/fault-ckpt.h5" --from 90)"
printf '%-52s %8.3f\n' "replay --from 0 (no checkpoint before: 100 steps)" "$(seconds "$H" replay "$work/cpu-ref.h5" --from 0)"
printf '%-52s %8.3f\n' "peer: the same run again (harness run)" "$(seconds "$H" run --out "$work/again.h5" --force)"
