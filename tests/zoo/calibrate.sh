#!/usr/bin/env bash
# The zoo's bf16 budget entries (canaries/budgets.toml, [zoo-MEMBER.torch-bf16]) measured
# again on this host: each member's fp32 and bf16 runs, then `harness calibrate --perturb 8`
# (the bf16 run repeated with every initial weight moved one ulp, seeds 1..8, against the
# fp32 run: docs/budgets.md, "Perturbation calibration"). Prints each proposed entry; a
# person reviews them, writes their rationale and replaces the shipped ones (docs/zoo.md).
#   tests/zoo/calibrate.sh [MEMBER ...]     default: every member
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
harness=${HARNESS_BIN:-$root/build/bin/harness}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export USE_TORCH_XLA=0 HARNESS_BIN=$harness PYTHONPATH=$root/python  # transformers: no torch_xla on the CPU
members=("$@")
[ ${#members[@]} -gt 0 ] || members=(gpt2 llama mixtral bert t5 accumulation)
for member in "${members[@]}"; do
  spec=$root/tests/zoo/$member.py:canary
  "$root/.venv/bin/python" -m canary_harness run "$spec" --out "$work/$member.h5" >/dev/null 2>&1
  "$root/.venv/bin/python" -m canary_harness run "$spec" --precision bf16 --out "$work/$member-bf16.h5" >/dev/null 2>&1
  "$harness" calibrate --perturb 8 --receipts "$work/$member-bf16.h5" --reference "$work/$member.h5" \
    --out "$work/$member.toml" >/dev/null
  awk -v entry="[zoo-$member.torch-bf16]" '$0 == entry {p = 1; print; next} /^\[/ {p = 0} p' "$work/$member.toml"
done
