#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the built-in
# `tiny` canary: the nightly matrix (canaries/nightly.toml), every lane checked against its
# golden and the cpu-ref lane, reports in reports/<UTC timestamp>/ (reports/latest links
# to the newest). The lanes run as shards at once (`harness nightly --jobs N`, N the cores up
# to 4, or HARNESS_NIGHTLY_JOBS), merged into one report. Extra arguments go to `harness
# nightly` (e.g. --shard 0/2, which runs that shard alone).
# Exit status is the nightly's: 0 all pass, 1 a regression, 2 an infrastructure error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh" --debian-only
# .venv/ (pip: one core, about 2 minutes when made) is made while the harness builds (the
# other core's idle moments and its own): the nightly's torch 2.x lanes need both.
venv_log=$(mktemp)
"$root/scripts/python-env.sh" >"$venv_log" 2>&1 &
venv_job=$!
trap 'kill "$venv_job" 2>/dev/null || true; rm -f "$venv_log"' EXIT
HARNESS_TARGET=harness "$root/scripts/build.sh" -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF
venv_status=0
wait "$venv_job" || venv_status=$?
cat "$venv_log"
[ "$venv_status" -eq 0 ] || exit "$venv_status"
mkdir -p "$root/reports"
stamp=$(date -u +%Y-%m-%dT%H-%M-%SZ)
status=0
cores=$(nproc)
jobs=(--jobs "${HARNESS_NIGHTLY_JOBS:-$((cores < 4 ? cores : 4))}")
for arg in "$@"; do
  case $arg in --shard | --shard=* | --jobs | --jobs=*) jobs=() ;; esac  # the caller's choice
done
"$root/build/bin/harness" nightly --out "$root/reports/$stamp" "${jobs[@]}" "$@" || status=$?
if [ -f "$root/reports/$stamp/summary.json" ]; then ln -sfn "$stamp" "$root/reports/latest"; fi
exit "$status"
