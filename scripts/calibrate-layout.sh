#!/usr/bin/env bash
# Calibrate a PyTorch lane's entries from pairs (docs/budgets.md, "Layouts: pairs of runs"),
# each pair two runs of the same initial weights, and each entry the feature torch-KIND:
#   ddp, fsdp  the layout against the one-process lane of the same torch on the same host
#              ([torch-ddp], [torch-fsdp], [llama-tiny.torch-ddp], ...);
#   cpu        the one-process lane against the harness's cpu-ref engine ([torch-cpu]);
#   host       the one-process lane on each host but the first against the same lane on the
#              first host ([torch-host]: what another CPU moves a real stack by).
# A sample is one pair; the pairs differ in the initial weights (the canary's own, which its
# nightly and goldens run, and --seeds N others, `harness export --seed`), the torch (each
# --python) and the host (each --hosts variant, from `harness hosts`); the pairs
# of the last --held-out-hosts K hosts (default 1 of 2 or more) are held out of the proposal
# and checked against it: an entry calibrated on some hosts, verified on the others.
#
# Usage: scripts/calibrate-layout.sh --canary C --layouts KIND[,KIND...] --python PY[,PY...]
#          [--hosts V,...] [--seeds N] [--held-out-hosts K] [--budgets B] [--provisional] [--widen] --out DIR
# Writes DIR/KIND.candidate.toml (+ .md), each read by the next kind's calibration, and
# keeps every receipt in DIR. --widen keeps every window at least the entry's current one
# (hosts measured before, that no variant here stands for). Exit 0 when every pair fits the
# proposals, 1 when not, 2 on bad input.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${HARNESS:-$root/build/bin/harness}
canary=tiny layouts=ddp pythons="" hosts="" seeds=8 held_out_hosts="" budgets=$root/canaries/budgets.toml out=""
flags=()  # --provisional, --widen: given to each calibration
usage() { echo "calibrate-layout.sh: $1 (usage: see the head of scripts/calibrate-layout.sh)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  if [ "$1" = --provisional ] || [ "$1" = --widen ]; then flags+=("$1"); shift; continue; fi
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
[[ "$seeds" =~ ^[0-9]+$ ]] || usage "--seeds: how many initialisations besides the canary's own (0 or more), not '$seeds'"
for layout in ${layouts//,/ }; do
  [[ "$layout" =~ ^(ddp|fsdp|cpu|host)$ ]] || usage "--layouts: ddp, fsdp, cpu or host, not '$layout'"
done
# Each host's environment assignments, from the harness's one table of presets ("" : as it is).
host_lines=$'as-is\t\t'
[ -z "$hosts" ] || host_lines=$("$harness" hosts "$hosts") || exit 2
host_count=$(grep -c . <<<"$host_lines")
[ -n "$held_out_hosts" ] || held_out_hosts=$((host_count > 1 ? 1 : 0))
[[ "$held_out_hosts" =~ ^[0-9]+$ ]] && [ "$held_out_hosts" -lt "$host_count" ] ||
  usage "--held-out-hosts: fewer than the $host_count host(s), not '$held_out_hosts'"
[[ ",$layouts," != *,host,* ]] || [ "$host_count" -ge 2 ] ||
  usage "--layouts: host pairs each host with the first; give two or more --hosts"
[[ ",$layouts," != *,host,* ]] || [ "$held_out_hosts" -lt $((host_count - 1)) ] ||
  usage "--held-out-hosts: host pairs need one host besides the first that is not held out"
mkdir -p "$out"
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}

# The initialisations: the canary's own (its [train] seed: the weights its nightly runs, which
# may drift further than any other seed's) and seeds 1..N.
inits=(own)
for ((s = 1; s <= seeds; s++)); do inits+=("seed$s"); done
# init_flags INIT: the flags that make INIT's weights (none: the canary's own)
init_flags() { [ "$1" = own ] || echo "--seed ${1#seed}"; }
# One pack per initialisation: the canary's data and schedule, those weights; for cpu pairs,
# the cpu-ref run of it (the harness's own engine: host-independent).
for init in "${inits[@]}"; do
  # shellcheck disable=SC2046
  [ -f "$out/pack-$init.h5" ] ||
    "$harness" export --canary "$canary" $(init_flags "$init") --out "$out/pack-$init.h5" >/dev/null
  # shellcheck disable=SC2046
  [[ ",$layouts," != *,cpu,* ]] || [ -f "$out/cpu-ref-$init.h5" ] ||
    "$harness" run --engine cpu-ref --canary "$canary" $(init_flags "$init") --out "$out/cpu-ref-$init.h5" >/dev/null
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

declare -A receipts references held first_host_one
host_index=0
while IFS=$'\t' read -r -u 3 host assignments _; do  # fd 3: the runs below read stdin
  host_index=$((host_index + 1))
  for python in ${pythons//,/ }; do
    version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])') ||
      usage "--python: $python cannot import torch"
    fsdp=$("$python" -c 'from canary_harness.distributed import fsdp_available; print(int(fsdp_available()))')
    for init in "${inits[@]}"; do
      tag="$host-torch$version-$init"
      one=$out/one-$tag.h5
      [ "$host_index" -gt 1 ] || first_host_one[$version-$init]=$one  # host pairs' reference: same torch, weights
      run_lane "$python" "$out/pack-$init.h5" "$one" "$assignments"
      for layout in ${layouts//,/ }; do
        case $layout in
          fsdp) [ "$fsdp" = 1 ] || continue ;;  # FSDP2 needs torch 2.6 on
          host) [ "$host_index" -gt 1 ] || continue ;;
        esac
        case $layout in
          ddp | fsdp)
            run_lane "$python" "$out/pack-$init.h5" "$out/$layout-$tag.h5" "$assignments" "$layout"
            receipts[$layout]+="$out/$layout-$tag.h5 " references[$layout]+="$one " ;;
          cpu) receipts[$layout]+="$one " references[$layout]+="$out/cpu-ref-$init.h5 " ;;
          host) receipts[$layout]+="$one " references[$layout]+="${first_host_one[$version-$init]} " ;;
        esac
        [ "$host_index" -le $((host_count - held_out_hosts)) ] || held[$layout]=$((${held[$layout]:-0} + 1))
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
    "${held_out[@]}" "${flags[@]}" --budgets "$candidate" --out "$out/$layout.candidate.toml" || status=$?
  [ "$status" -le 1 ] || exit "$status"
  candidate=$out/$layout.candidate.toml
done
exit "$status"
