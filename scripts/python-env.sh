#!/usr/bin/env bash
# The pinned Python environment .venv/ at the repository root (docs/python-env.md): torch
# 2.9.0, torch_xla 2.9.0, JAX 0.7.1, numpy, h5py, xxhash, pytest, each version and file hash pinned in
# python/requirements-venv.txt, and canary_harness installed editable from python/.
#   scripts/python-env.sh          make it, or reuse it, or repair it
#   scripts/python-env.sh --check  exit 0 when it is up to date, 1 when not; changes nothing
# Reused while it was made from this very requirements file (its sha256 is stamped into
# .venv/ last, so an interrupted install is never taken for a finished one) and imports;
# anything else (another requirements file, a broken install, a missing stamp) is made
# again from scratch, but a package whose layout alone moved is installed again by itself. Wheels come from the Python package index into a per-machine cache
# (~/.cache/canary-harness/wheels, or CANARY_HARNESS_WHEELS): downloaded once per machine.
# Where neither the cache nor the index has them it says so in one line and exits 0:
# Debian's torch 1.13 still runs every suite, and the torch 2.x suite is not registered.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
requirements=$root/python/requirements-venv.txt
stamp=$venv/.requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)

# The editable install maps each module the package had when it was installed to its file
# (scikit-build-core's redirecting finder): a module that became a room of the same name
# (canary_harness.xla) is then looked for at the old file. So the install is stamped with the
# package's layout, and made again, alone, when the layout moved.
layout_stamp=$venv/.package-layout.sha256
layout=$({ (cd "$root/python" && find canary_harness -name '*.py') 2>/dev/null || true; } | LC_ALL=C sort | sha256sum | cut -d' ' -f1)

requirements_installed() {
  [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] &&
    PJRT_DEVICE=CPU "$venv/bin/python" -c 'import torch, torch_xla, jax, transformers, accelerate, numpy, h5py, xxhash, pytest, canary_harness' >/dev/null 2>&1
}

installed=0
requirements_installed && installed=1
if [ "$installed" = 1 ] && [ "$(cat "$layout_stamp" 2>/dev/null)" = "$layout" ]; then
  echo "python-env: .venv/ is up to date ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "python-env: .venv/ is missing or out of date; run scripts/python-env.sh" >&2
  exit 1
fi
start=$(date +%s)
pip_quiet=(--quiet --disable-pip-version-check)
# Editable: the tests and the CLI run the package in python/ as it is edited. scikit-build-core
# (pinned in the requirements) builds its two libraries into .venv/ once; where HARNESS_BIN
# names a harness, the package takes that harness's libraries first (docs/python.md, "Install").
install_package() {
  "$venv/bin/pip" install "${pip_quiet[@]}" --no-deps --no-build-isolation -e "$root/python"
  echo "$layout" > "$layout_stamp"
}
if [ "$installed" = 1 ]; then  # only the package's layout moved (or it has no stamp yet)
  install_package
  echo "python-env: canary_harness installed again into .venv/ for its new layout in $(( $(date +%s) - start )) s"
  exit 0
fi
# Wheels are kept in a per-machine cache: a repair, or another clone on this machine,
# installs from it without the index; only what it lacks is downloaded.
cache=${CANARY_HARNESS_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/canary-harness/wheels}
mkdir -p "$cache"
# Room first. A disk that fills during the install fails whatever else writes to it (command
# 1's build beside this: "No space left on device" from the compiler, naming neither), so
# nothing starts without it: .venv/ is 7.8 GB installed, the wheels 4.1 GB (a cache without
# torch's wheel is taken to need them all). The sizes themselves: less cannot hold them. room PATH GB WHAT: PATH's disk has GB free,
# or WHAT is refused in one line (exit 2).
room() {
  local free
  free=$(df -P -k "$1" | awk 'NR == 2 { print int($4 / 1048576) }')
  [ "$free" -ge "$2" ] || {
    echo "python-env: $3 needs about $2 GB free at $1, and $free GB is: free space there" \
         "(the wheels may go elsewhere: CANARY_HARNESS_WHEELS, docs/python-env.md); nothing was changed" >&2
    exit 2
  }
}
need_venv=8 need_wheels=0
compgen -G "$cache/torch-*.whl" >/dev/null || need_wheels=4
if [ "$(stat -c %d "$root")" = "$(stat -c %d "$cache")" ]; then  # one disk: both on it
  need_venv=$((need_venv + need_wheels)) need_wheels=0
fi
room "$root" "$need_venv" "making .venv/"
room "$cache" "$need_wheels" "downloading the wheels"
install_from_cache() {
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install "${pip_quiet[@]}" --no-index --find-links "$cache" --require-hashes -r "$requirements"
}
if ! install_from_cache >/dev/null 2>&1; then
  # pip's own configuration (PIP_INDEX_URL, pip.conf) decides which index it asks.
  echo "python-env: downloading python/requirements-venv.txt's wheels into $cache (about 4.5 GB the first time)"
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if ! "$venv/bin/pip" download "${pip_quiet[@]}" --retries 2 --no-deps -r "$requirements" -d "$cache" >"$log" 2>&1; then
    rm -rf "$venv"
    echo "python-env: the Python package index that pip is configured with is not reachable and $cache lacks" \
         "wheels ($(tail -n 1 "$log")): .venv/ (torch 2.9) is not made, and the torch 2.x suite will not run" \
         "(docs/python-env.md)" >&2
    exit 0
  fi
  install_from_cache
fi
install_package
version=$(PJRT_DEVICE=CPU "$venv/bin/python" -c 'import torch, torch_xla, jax, transformers, accelerate, numpy, h5py, xxhash, pytest, canary_harness; print(torch.__version__)')
echo "$want" > "$stamp"  # last: an interrupted install has no stamp, and is made again
echo "python-env: .venv/ made in $(( $(date +%s) - start )) s: torch $version, $(du -sh "$venv" | cut -f1)"
