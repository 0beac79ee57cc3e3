#!/usr/bin/env bash
# The Python package installs with pip into a fresh virtual environment and works there:
# `pip install ./python` the offline way (no package index: Debian's numpy, h5py and
# xxhash come through --system-site-packages; docs/python.md says why), then its tests
# run against the installed copy, not the source tree.
#   scripts/python-venv-check.sh [HARNESS_BIN]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${1:-$root/build/bin/harness}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$venv"
# Build in a copy: setuptools leaves build/ and *.egg-info behind in the source tree.
cp -r "$root/python" "$venv/src"
"$venv/bin/pip" install --quiet --no-build-isolation --no-deps "$venv/src"
# The tests alone, away from the sources, so that they import the installed package.
cp -r "$root/python/tests" "$venv/tests"
cd "$venv"
"$venv/bin/python" -c 'import canary_harness, sys; sys.exit(0 if canary_harness.__file__.startswith(sys.prefix) else 1)' \
  || { echo "python-venv-check: canary_harness did not import from the virtual environment" >&2; exit 1; }
HARNESS_BIN=$harness CANARY_HARNESS_EXAMPLES=$root/examples CANARY_HARNESS_BENCH=$root/bench CANARY_HARNESS_VECTORS=$root/docs/receipt-test-vectors.json CANARY_HARNESS_DOCS=$root/docs PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -c /dev/null \
  --rootdir "$venv/tests" "$venv/tests"
