#!/usr/bin/env bash
# The zoo's bf16 budget entries (canaries/budgets.toml, [zoo-MEMBER.torch-bf16]) measured
# again on this host: each member's bf16 lane (a matrix of
# its fp32 and bf16 lanes on .venv/'s torch, written here) run PERTURB times with every
# initial weight moved one ulp (seeds 1..PERTURB) against the fp32 lane, the last HELD_OUT
# samples held out of the proposal and checked against it (the entry's false-alarm bound),
# and the power ladders under the proposal (docs/budgets.md, "Perturbation calibration",
# "Detection power"). --widen: no window shrinks below the shipped entry's, which holds the
# hosts it was measured on before (its host_cpus). Prints each proposed entry and keeps each
# report under OUT; a person reviews them, writes their rationale and replaces the shipped
# ones (docs/zoo.md).
#   tests/zoo/calibrate.sh [MEMBER ...]     default: every member
#   PERTURB (default 24), HELD_OUT (8), OUT (a directory; default: a temporary one, removed)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
harness=${HARNESS_BIN:-$root/build/bin/harness}
perturb=${PERTURB:-24} held_out=${HELD_OUT:-8}
if [ -n "${OUT:-}" ]; then
  work=$OUT
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
export USE_TORCH_XLA=0 HARNESS_BIN=$harness PYTHONPATH=$root/python  # transformers: no torch_xla on the CPU
members=("$@")
[ ${#members[@]} -gt 0 ] || members=(gpt2 llama mixtral bert t5 accumulation)
for member in "${members[@]}"; do
  [ -f "$root/tests/zoo/$member.py" ] || { echo "calibrate.sh: no member '$member' in tests/zoo/" >&2; exit 2; }
  cat > "$work/$member.nightly.toml" <<TOML
schema_version = 1
canary = "$root/tests/zoo/$member.py:canary"
python = "$root/.venv/bin/python"
reference = "fp32"

[[lanes]]
id = "fp32"
engine = "torch"
why = "The member's fp32 run: the reference its bf16 lane is judged against."

[[lanes]]
id = "bf16"
engine = "torch"
precision = "bf16"
why = "bf16 autocast around the team's step: what [zoo-$member.torch-bf16] budgets."
TOML
  # calibrate exits 1 when its report has a finding (a repeat outside the proposal, a window
  # too loose, a one-sided drift); the candidate is still written. Exit 2 writes none: one left from an
  # earlier run in OUT must not pass for this one's.
  rm -f "$work/$member.toml"
  "$harness" calibrate --perturb "$perturb" --held-out "$held_out" --power --widen --lane bf16 \
    --matrix "$work/$member.nightly.toml" --out "$work/$member.toml" > "$work/$member.log" 2>&1 ||
    [ -s "$work/$member.toml" ] || { cat "$work/$member.log" >&2; exit 1; }
  awk -v entry="[zoo-$member.torch-bf16]" '$0 == entry {p = 1; print; next} /^\[/ {p = 0} p' "$work/$member.toml"
done
