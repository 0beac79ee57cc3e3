#!/usr/bin/env bash
# Calibrate a PyTorch lane's entries from pairs (docs/budgets.md, "Layouts: pairs of runs"),
# each pair two runs of the same initial weights, and each entry the feature torch-KIND:
#   ddp, fsdp  the layout against the one-process lane of the same torch on the same host
#              ([torch-ddp], [torch-fsdp], [llama-tiny.torch-ddp], ...);
#   cpu        the one-process lane against the harness's cpu-ref engine ([torch-cpu]);
#   host       the one-process lane on each host but the first against the same lane on the
#              first host ([torch-host]: what another CPU moves a real stack by);
#   bf16       the one-process lane under bf16 autocast against cpu-ref ([torch-bf16]);
#   host-bf16  the bf16 lane on each host but the first against it on the first host
#              ([torch-host-bf16]);
#   compile    the lane under torch.compile against the eager lane of the same torch and
#              host ([torch-compile]; interpreters without torch.compile give none).
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
  [[ "$layout" =~ ^(ddp|fsdp|cpu|host|bf16|host-bf16|compile)$ ]] ||
    usage "--layouts: ddp, fsdp, cpu, host, bf16, host-bf16 or compile, not '$layout'"
done
# Each host's environment assignments, from the harness's one table of presets ("" : as it is).
host_lines=$'as-is\t\t'
[ -z "$hosts" ] || host_lines=$("$harness" hosts "$hosts") || exit 2
host_count=$(grep -c . <<<"$host_lines")
[ -n "$held_out_hosts" ] || held_out_hosts=$((host_count > 1 ? 1 : 0))
[[ "$held_out_hosts" =~ ^[0-9]+$ ]] && [ "$held_out_hosts" -lt "$host_count" ] ||
  usage "--held-out-hosts: fewer than the $host_count host(s), not '$held_out_hosts'"
if [[ ",$layouts," == *,host,* || ",$layouts," == *,host-bf16,* ]]; then
  [ "$host_count" -ge 2 ] || usage "--layouts: host pairs each host with the first; give two or more --hosts"
  [ "$held_out_hosts" -lt $((host_count - 1)) ] ||
    usage "--held-out-hosts: host pairs need one host besides the first that is not held out"
fi
# HARNESS_BIN: the lanes digest their tensors with the harness's library, not numpy's loops.
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH} HARNESS_BIN=$harness
# supported[PYTHON,KIND]: 1 where PYTHON's torch has what KIND needs (compile: torch.compile,
# torch 2.0 on; fsdp: FSDP2, torch 2.6 on; every other kind: any torch). A kind needs one.
declare -A supported
for layout in ${layouts//,/ }; do
  found=0
  for python in ${pythons//,/ }; do
    case $layout in
      compile) probe='import torch; print(int(hasattr(torch, "compile")))' ;;
      fsdp) probe='from canary_harness.distributed import fsdp_available; print(int(fsdp_available()))' ;;
      *) probe='import torch; print(1)' ;;
    esac
    supported[$python,$layout]=$("$python" -c "$probe" 2>/dev/null) || usage "--python: $python cannot import torch"
    [ "${supported[$python,$layout]}" != 1 ] || found=1
  done
  [ "$found" = 1 ] || usage "--layouts $layout: no --python interpreter's torch has it (compile: 2.0 on; fsdp: 2.6 on)"
done
mkdir -p "$out"

# The initialisations: the canary's own (its [train] seed: the weights its nightly runs, which
# may drift further than any other seed's) and seeds 1..N.
inits=(own)
for ((s = 1; s <= seeds; s++)); do inits+=("seed$s"); done
# init_flags INIT: the flags that make INIT's weights (none: the canary's own)
init_flags() { [ "$1" = own ] || echo "--seed ${1#seed}"; }
# One pack per initialisation: the canary's data and schedule, those weights; for cpu and bf16 pairs,
# the cpu-ref run of it (the harness's own engine: host-independent).
for init in "${inits[@]}"; do
  # shellcheck disable=SC2046
  [ -f "$out/pack-$init.h5" ] ||
    "$harness" export --canary "$canary" $(init_flags "$init") --out "$out/pack-$init.h5" >/dev/null
  # shellcheck disable=SC2046
  [[ ",$layouts," != *,cpu,* && ",$layouts," != *,bf16,* ]] || [ -f "$out/cpu-ref-$init.h5" ] ||
    "$harness" run --engine cpu-ref --canary "$canary" $(init_flags "$init") --out "$out/cpu-ref-$init.h5" >/dev/null
done

# run_lane PYTHON PACK OUT ENV [LANE FLAGS...]: the torch lane (1 thread a rank), under ENV.
run_lane() {
  local python=$1 pack=$2 receipt=$3 assignments=$4
  shift 4
  [ -f "$receipt" ] && return 0  # a pair already made: the receipts are kept in DIR
  # Written beside and moved in when complete: a failed run leaves no receipt to be reused.
  # shellcheck disable=SC2086
  env $assignments "$python" -m canary_harness.lane --pack "$pack" --out "${receipt%.h5}.partial.h5" --force \
    --canary "$canary" "$@" >"$receipt.log" 2>&1 ||
    { echo "calibrate-layout.sh: $receipt failed ($receipt.log)" >&2; exit 1; }
  mv "${receipt%.h5}.partial.h5" "$receipt"
}

declare -A receipts references held first_host_one first_host_bf16
host_index=0
while IFS=$'\t' read -r -u 3 host assignments _; do  # fd 3: the runs below read stdin
  host_index=$((host_index + 1))
  for python in ${pythons//,/ }; do
    version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])') ||
      usage "--python: $python cannot import torch"
    for init in "${inits[@]}"; do
      tag="$host-torch$version-$init" pack=$out/pack-$init.h5
      one=$out/one-$tag.h5 bf16=$out/bf16-$tag.h5
      run_lane "$python" "$pack" "$one" "$assignments"
      [[ ",$layouts," != *bf16,* ]] || run_lane "$python" "$pack" "$bf16" "$assignments" --precision bf16
      # host pairs' references: the same torch and weights on the first host
      [ "$host_index" -gt 1 ] || { first_host_one[$version-$init]=$one; first_host_bf16[$version-$init]=$bf16; }
      for layout in ${layouts//,/ }; do
        [ "${supported[$python,$layout]}" = 1 ] || continue
        case $layout in host | host-bf16) [ "$host_index" -gt 1 ] || continue ;; esac
        case $layout in
          ddp | fsdp)
            run_lane "$python" "$pack" "$out/$layout-$tag.h5" "$assignments" --layout "$layout"
            receipts[$layout]+="$out/$layout-$tag.h5 " references[$layout]+="$one " ;;
          compile)
            run_lane "$python" "$pack" "$out/compile-$tag.h5" "$assignments" --compile
            receipts[$layout]+="$out/compile-$tag.h5 " references[$layout]+="$one " ;;
          cpu) receipts[$layout]+="$one " references[$layout]+="$out/cpu-ref-$init.h5 " ;;
          bf16) receipts[$layout]+="$bf16 " references[$layout]+="$out/cpu-ref-$init.h5 " ;;
          host) receipts[$layout]+="$one " references[$layout]+="${first_host_one[$version-$init]} " ;;
          host-bf16) receipts[$layout]+="$bf16 " references[$layout]+="${first_host_bf16[$version-$init]} " ;;
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
