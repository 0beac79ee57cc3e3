#!/usr/bin/env bash
# The Python package installs with pip into a fresh virtual environment of Debian's python3
# and works there: the wheel that `pip install ./python` builds (scikit-build-core drives
# the CMake build of the harness's digest and receipt-writer libraries into it), installed
# the offline way (no package index: Debian's numpy, h5py and xxhash come through
# --system-site-packages; docs/python.md, "Install"); the package finds its own libraries
# with no harness named, and its tests run against the installed copy, every receipt and
# digest through the libraries the wheel carries.
#   scripts/python-venv-check.sh [HARNESS_BIN]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${1:-$root/build/bin/harness}
# Debian 12 packages no scikit-build-core (and its packaging is older than it needs): the
# pinned environment .venv/ holds both, so the wheel is built there and installed here.
[ -x "$root/.venv/bin/pip" ] || {
  echo "python-venv-check: no .venv/ to build the package's wheel with (scripts/python-env.sh makes it)" >&2
  exit 1
}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$root/.venv/bin/pip" wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  "$root/python" -w "$venv/dist"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$venv"/dist/canary_harness-*.whl
# The tests alone, away from the sources, so that they import the installed package.
cp -r "$root/python/tests" "$venv/tests"
cd "$venv"
# No harness named and none on PATH: the package's own libraries, from the environment.
libraries=$(env -u HARNESS_BIN PATH=/usr/bin:/bin "$venv/bin/python" - <<'EOF'
import sys
import canary_harness
from canary_harness.receipts.native import native_digest
from canary_harness.receipts.receipt_native import receipt_library
paths = [canary_harness.__file__] + [library.path if library else "(none)" for library in (native_digest(), receipt_library())]
outside = [path for path in paths if not path.startswith(sys.prefix)]
if outside:
    sys.exit(f"python-venv-check: not from the virtual environment {sys.prefix}: {', '.join(outside)}")
print(" ".join(paths[1:]))
EOF
)
read -r digest_library writer_library <<<"$libraries"
HARNESS_BIN=$harness CANARY_HARNESS_DIGEST=$digest_library CANARY_HARNESS_WRITER=$writer_library \
  CANARY_HARNESS_EXAMPLES=$root/examples CANARY_HARNESS_BENCH=$root/bench \
  CANARY_HARNESS_VECTORS=$root/docs/receipt-test-vectors.json CANARY_HARNESS_DOCS=$root/docs \
  PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -c /dev/null \
  --rootdir "$venv/tests" "$venv/tests"
