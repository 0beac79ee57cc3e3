#!/usr/bin/env bash
# Calibrate a distributed layout's entry ([torch-ddp], [torch-fsdp], [llama-tiny.torch-ddp],
# ...) from pairs (docs/budgets.md, "Layouts: pairs of runs"): the layout against the
# one-process lane of the same torch, the same initial weights and the same host. A sample
# is one pair; the pairs differ in the initial weights (`harness export --seed`), the torch
# (each --python) and the host (each --hosts variant, from `harness hosts`); the pairs of the
# last --held-out-hosts K hosts (default 1 of 2 or more) are held out of the proposal and
# checked against it: an entry calibrated on some hosts, verified on the others.
#
# Usage: scripts/calibrate-layout.sh --canary C --layouts ddp[,fsdp] --python PY[,PY...]
#          [--hosts V,...] [--seeds N] [--held-out-hosts K] [--budgets B] [--provisional] --out DIR
# Writes DIR/LAYOUT.candidate.toml (+ .md), each read by the next layout's calibration,
# and keeps every receipt in DIR. Exit 0 when every pair fits the proposals, 1 when not,
# 2 on bad input.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${HARNESS:-$root/build/bin/harness}
canary=tiny layouts=ddp pythons="" hosts="" seeds=8 held_out_hosts="" budgets=$root/canaries/budgets.toml out="" provisional=()
usage() { echo "calibrate-layout.sh: $1 (usage: see the head of scripts/calibrate-layout.sh)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  if [ "$1" = --provisional ]; then provisional=(--provisional); shift; continue; fi
  [ $# -ge 2 ] || usage "$1 needs a value"
  case $1 in
    --canary) canary=$2 ;; --layouts) layouts=$2 ;; --python) pythons=$2 ;; --hosts) hosts=$2 ;;
    --seeds) seeds=$2 ;; --held-out-hosts) held_out_hosts=$2 ;; --budgets) budgets=$2 ;; --out) out=$2 ;;
    *) usage "unknown flag $1" ;;
  esac
  shift 2
done
[ -x "$harness" ] || usage "$harness is not built; run scripts/build.sh first"
[ -n "$out" ] || usage "--out: name the directory for the receipts and candidates"
[ -n "$pythons" ] || usage "--python: name the interpreters with torch (e.g. .venv/bin/python,/usr/bin/python3)"
[[ "$seeds" =~ ^[1-9][0-9]*$ ]] || usage "--seeds: a positive count, not '$seeds'"
for layout in ${layouts//,/ }; do
  [[ "$layout" =~ ^(ddp|fsdp)$ ]] || usage "--layouts: ddp or fsdp, not '$layout'"
done
# Each host's environment assignments, from the harness's one table of presets ("" : as it is).
host_lines=$'as-is\t\t'
[ -z "$hosts" ] || host_lines=$("$harness" hosts "$hosts") || exit 2
host_count=$(grep -c . <<<"$host_lines")
[ -n "$held_out_hosts" ] || held_out_hosts=$((host_count > 1 ? 1 : 0))
[[ "$held_out_hosts" =~ ^[0-9]+$ ]] && [ "$held_out_hosts" -lt "$host_count" ] ||
  usage "--held-out-hosts: fewer than the $host_count host(s), not '$held_out_hosts'"
mkdir -p "$out"
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}

# One pack per initial-weight seed: the canary's data and schedule, another initialisation.
for ((s = 1; s <= seeds; s++)); do
  [ -f "$out/pack-$s.h5" ] || "$harness" export --canary "$canary" --seed "$s" --out "$out/pack-$s.h5" >/dev/null
done

# run_lane PYTHON PACK OUT ENV [LAYOUT]: the torch lane (1 thread a rank), under ENV.
run_lane() {
  local python=$1 pack=$2 receipt=$3 assignments=$4 layout=${5:-}
  [ -f "$receipt" ] && return 0  # a pair already made: the receipts are kept in DIR
  # Written beside and moved in when complete: a failed run leaves no receipt to be reused.
  # shellcheck disable=SC2086
  env $assignments "$python" -m canary_harness.lane --pack "$pack" --out "${receipt%.h5}.partial.h5" --force \
    --canary "$canary" ${layout:+--layout "$layout"} >"$receipt.log" 2>&1 ||
    { echo "calibrate-layout.sh: $receipt failed ($receipt.log)" >&2; exit 1; }
  mv "${receipt%.h5}.partial.h5" "$receipt"
}

declare -A receipts references held
host_index=0
while IFS=$'\t' read -r -u 3 host assignments _; do  # fd 3: the runs below read stdin
  host_index=$((host_index + 1))
  for python in ${pythons//,/ }; do
    version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])') ||
      usage "--python: $python cannot import torch"
    fsdp=$("$python" -c 'from canary_harness.distributed import fsdp_available; print(int(fsdp_available()))')
    for ((s = 1; s <= seeds; s++)); do
      tag="$host-torch$version-seed$s"
      run_lane "$python" "$out/pack-$s.h5" "$out/one-$tag.h5" "$assignments"
      for layout in ${layouts//,/ }; do
        [ "$layout" = fsdp ] && [ "$fsdp" = 0 ] && continue  # FSDP2 needs torch 2.6 on
        run_lane "$python" "$out/pack-$s.h5" "$out/$layout-$tag.h5" "$assignments" "$layout"
        receipts[$layout]+="$out/$layout-$tag.h5 "
        [ "$host_index" -le $((host_count - held_out_hosts)) ] || held[$layout]=$((${held[$layout]:-0} + 1))
        references[$layout]+="$out/one-$tag.h5 "
      done
    done
  done
done 3<<<"$host_lines"

status=0
candidate=$budgets
for layout in ${layouts//,/ }; do
  held_out=()
  [ "${held[$layout]:-0}" -eq 0 ] || held_out=(--held-out "${held[$layout]}")
  # shellcheck disable=SC2086
  "$harness" calibrate --receipts ${receipts[$layout]} --reference ${references[$layout]} --feature "torch-$layout" \
    "${held_out[@]}" "${provisional[@]}" --budgets "$candidate" --out "$out/$layout.candidate.toml" || status=$?
  [ "$status" -le 1 ] || exit "$status"
  candidate=$out/$layout.candidate.toml
done
exit "$status"
