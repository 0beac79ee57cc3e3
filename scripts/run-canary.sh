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
"$root/scripts/install-deps.sh"
HARNESS_TARGET=harness "$root/scripts/build.sh" -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF
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
