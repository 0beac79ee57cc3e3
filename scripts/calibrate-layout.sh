#!/usr/bin/env bash
# Calibrate a real stack's entries from pairs (docs/budgets.md, "Layouts: pairs of runs"),
# each pair two runs of the same initial weights, one KIND of pair per entry:
#   ddp, fsdp      the PyTorch lane on 2 processes against its one-process run of the same
#                  torch on the same host ([torch-ddp], [torch-fsdp]; FSDP2: torch 2.6 on);
#   compile        the lane under torch.compile against the eager run of the same torch and
#                  host ([torch-compile]; torch 2.0 on);
#   cpu            the one-process lane against the harness's cpu-ref engine ([torch-cpu]);
#   bf16           the lane under bf16 autocast against cpu-ref ([torch-bf16]);
#   xla            the lane on torch_xla's CPU client (--device xla) against cpu-ref ([torch-xla]);
#   jax, jax-bf16  the JAX lane (canary_harness.jax, 1x1 dp; fp32, or bf16 matmul operands)
#                  against cpu-ref ([jax], [jax-bf16]);
#   host, host-bf16, compile-host, xla-host, jax-host, jax-bf16-host
#                  the run of cpu, bf16, compile, xla, jax or jax-bf16 on each host but the
#                  first against the same run on the first host ([torch-host],
#                  [torch-host-bf16], [torch-host] again for the compiled lane,
#                  [torch-xla-host], [jax-host], [jax-bf16-host]: what another CPU moves a
#                  real stack by).
# A sample is one pair; the pairs differ in the initial weights (the canary's own, which its
# nightly and goldens run, and --seeds N others, `harness export --seed`), the interpreter
# (each --python) and the host (each --hosts variant, from `harness hosts`); the pairs
# of the last --held-out-hosts K hosts (default 1 of 2 or more) are held out of the proposal
# and checked against it: an entry calibrated on some hosts, verified on the others.
# A kind runs on the interpreters that have what it needs (torch_xla, JAX, a torch version);
# one that none has is refused before any run.
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

# Each kind: the run it pairs (a name of run_argv below), what that run is judged against
# (cpu-ref, the same run on the first host, or another run of the same host), and its feature.
declare -A pair_run=(
  [ddp]=ddp [fsdp]=fsdp [compile]=compile [cpu]=one [bf16]=bf16 [xla]=xla [jax]=jax [jax-bf16]=jax-bf16
  [host]=one [host-bf16]=bf16 [compile-host]=compile [xla-host]=xla [jax-host]=jax [jax-bf16-host]=jax-bf16)
declare -A pair_reference=(
  [ddp]=one [fsdp]=one [compile]=one [cpu]=cpu-ref [bf16]=cpu-ref [xla]=cpu-ref [jax]=cpu-ref [jax-bf16]=cpu-ref
  [host]=first-host [host-bf16]=first-host [compile-host]=first-host [xla-host]=first-host [jax-host]=first-host
  [jax-bf16-host]=first-host)
declare -A pair_feature=(
  [ddp]=torch-ddp [fsdp]=torch-fsdp [compile]=torch-compile [cpu]=torch-cpu [bf16]=torch-bf16 [xla]=torch-xla
  [jax]=jax [jax-bf16]=jax-bf16 [host]=torch-host [host-bf16]=torch-host-bf16 [compile-host]=torch-host
  [xla-host]=torch-xla-host
  [jax-host]=jax-host [jax-bf16-host]=jax-bf16-host)
kinds="ddp, fsdp, compile, cpu, bf16, xla, jax, jax-bf16, host, host-bf16, compile-host, xla-host, jax-host or jax-bf16-host"
# run_argv RUN: the module and flags of RUN (1 thread a rank: the lanes' default)
run_argv() {
  case $1 in
    one) echo "-m canary_harness.lane --canary $canary" ;;
    bf16) echo "-m canary_harness.lane --canary $canary --precision bf16" ;;
    xla) echo "-m canary_harness.lane --canary $canary --device xla" ;;
    ddp | fsdp) echo "-m canary_harness.lane --canary $canary --layout $1" ;;
    compile) echo "-m canary_harness.lane --canary $canary --compile" ;;
    jax) echo "-m canary_harness.jax" ;;
    jax-bf16) echo "-m canary_harness.jax --precision bf16" ;;
  esac
}
# run_probe RUN: Python that prints 1 where the interpreter can make RUN
run_probe() {
  case $1 in
    compile) echo 'import torch; print(int(hasattr(torch, "compile")))' ;;
    fsdp) echo 'from canary_harness.runs.distributed import fsdp_available; print(int(fsdp_available()))' ;;
    xla) echo 'import importlib.util as u; print(int(u.find_spec("torch_xla") is not None))' ;;
    jax | jax-bf16) echo 'import importlib.util as u; print(int(u.find_spec("jax") is not None))' ;;
    *) echo 'import torch; print(1)' ;;
  esac
}
for layout in ${layouts//,/ }; do
  [ -n "${pair_run[$layout]:-}" ] || usage "--layouts: $kinds, not '$layout'"
done
# Each host's environment assignments, from the harness's one table of presets ("" : as it is).
host_lines=$'as-is\t\t'
[ -z "$hosts" ] || host_lines=$("$harness" hosts "$hosts") || exit 2
host_count=$(grep -c . <<<"$host_lines")
[ -n "$held_out_hosts" ] || held_out_hosts=$((host_count > 1 ? 1 : 0))
[[ "$held_out_hosts" =~ ^[0-9]+$ ]] && [ "$held_out_hosts" -lt "$host_count" ] ||
  usage "--held-out-hosts: fewer than the $host_count host(s), not '$held_out_hosts'"
for layout in ${layouts//,/ }; do
  [ "${pair_reference[$layout]}" = first-host ] || continue
  [ "$host_count" -ge 2 ] || usage "--layouts: $layout pairs each host with the first; give two or more --hosts"
  [ "$held_out_hosts" -lt $((host_count - 1)) ] ||
    usage "--held-out-hosts: $layout pairs need one host besides the first that is not held out"
done
# HARNESS_BIN: the lanes digest their tensors with the harness's library, not numpy's loops.
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH} HARNESS_BIN=$harness
# supported[PYTHON,KIND]: 1 where PYTHON can make KIND's runs; each kind needs one such PYTHON.
declare -A supported can_make  # can_make[PYTHON,RUN]: each probe once (an import of torch each)
for layout in ${layouts//,/ }; do
  found=0
  for python in ${pythons//,/ }; do
    supported[$python,$layout]=1
    for run in "${pair_run[$layout]}" "${pair_reference[$layout]}"; do
      [ "$run" != cpu-ref ] && [ "$run" != first-host ] || continue
      [ -n "${can_make[$python,$run]:-}" ] || can_make[$python,$run]=$("$python" -c "$(run_probe "$run")" 2>/dev/null) ||
        usage "--python: $python cannot import torch"
      [ "${can_make[$python,$run]}" = 1 ] || supported[$python,$layout]=0
    done
    [ "${supported[$python,$layout]}" != 1 ] || found=1
  done
  [ "$found" = 1 ] ||
    usage "--layouts $layout: no --python interpreter has what it needs (compile: torch 2.0 on; fsdp: 2.6 on; xla: torch_xla; jax: JAX)"
done
mkdir -p "$out"

# The initialisations: the canary's own (its [train] seed: the weights its nightly runs, which
# may drift further than any other seed's) and seeds 1..N.
inits=(own)
for ((s = 1; s <= seeds; s++)); do inits+=("seed$s"); done
# init_flags INIT: the flags that make INIT's weights (none: the canary's own)
init_flags() { [ "$1" = own ] || echo "--seed ${1#seed}"; }
# One pack per initialisation: the canary's data and schedule, those weights; where a kind is
# judged against cpu-ref, the cpu-ref run of it (the harness's own engine: host-independent).
needs_cpu_ref=0
for layout in ${layouts//,/ }; do [ "${pair_reference[$layout]}" != cpu-ref ] || needs_cpu_ref=1; done
for init in "${inits[@]}"; do
  # shellcheck disable=SC2046
  [ -f "$out/pack-$init.h5" ] ||
    "$harness" export --canary "$canary" $(init_flags "$init") --out "$out/pack-$init.h5" >/dev/null
  # shellcheck disable=SC2046
  [ "$needs_cpu_ref" = 0 ] || [ -f "$out/cpu-ref-$init.h5" ] ||
    "$harness" run --engine cpu-ref --canary "$canary" $(init_flags "$init") --out "$out/cpu-ref-$init.h5" >/dev/null
done

# make_run PYTHON RUN PACK OUT ENV: RUN of PACK into OUT under ENV, unless OUT was made before.
make_run() {
  local python=$1 run=$2 pack=$3 receipt=$4 assignments=$5
  [ -f "$receipt" ] && return 0  # a pair already made: the receipts are kept in DIR
  # Written beside and moved in when complete: a failed run leaves no receipt to be reused.
  # shellcheck disable=SC2086,SC2046
  env $assignments "$python" $(run_argv "$run") --pack "$pack" --out "${receipt%.h5}.partial.h5" --force \
    >"$receipt.log" 2>&1 || { echo "calibrate-layout.sh: $receipt failed ($receipt.log)" >&2; exit 1; }
  mv "${receipt%.h5}.partial.h5" "$receipt"
}

declare -A receipts references held first_host
host_index=0
while IFS=$'\t' read -r -u 3 host assignments _; do  # fd 3: the runs below read stdin
  host_index=$((host_index + 1))
  for python in ${pythons//,/ }; do
    version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])') ||
      usage "--python: $python cannot import torch"
    for init in "${inits[@]}"; do
      tag="$host-torch$version-$init" pack=$out/pack-$init.h5
      for layout in ${layouts//,/ }; do
        [ "${supported[$python,$layout]}" = 1 ] || continue
        run=${pair_run[$layout]} reference=${pair_reference[$layout]}
        receipt=$out/$run-$tag.h5
        make_run "$python" "$run" "$pack" "$receipt" "$assignments"
        # the first host's run: the reference of the host kinds (same interpreter and weights)
        [ "$host_index" -gt 1 ] || first_host[$run-$version-$init]=$receipt
        case $reference in
          cpu-ref) reference=$out/cpu-ref-$init.h5 ;;
          first-host) [ "$host_index" -gt 1 ] || continue; reference=${first_host[$run-$version-$init]} ;;
          *) make_run "$python" "$reference" "$pack" "$out/$reference-$tag.h5" "$assignments"
             reference=$out/$reference-$tag.h5 ;;
        esac
        receipts[$layout]+="$receipt " references[$layout]+="$reference "
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
  "$harness" calibrate --receipts ${receipts[$layout]} --reference ${references[$layout]} --feature "${pair_feature[$layout]}" \
    "${held_out[@]}" "${flags[@]}" --budgets "$candidate" --out "$out/$layout.candidate.toml" || status=$?
  [ "$status" -le 1 ] || exit "$status"
  candidate=$out/$layout.candidate.toml
done
exit "$status"
