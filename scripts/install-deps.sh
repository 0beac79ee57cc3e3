#!/usr/bin/env bash
# Installs what this project needs from Debian 12's packages, and only what is missing,
# then the pinned Python environment .venv/ (scripts/python-env.sh: torch 2.9 from the
# Python package index, where it is reachable). Idempotent; runs apt-get directly as root
# and through sudo otherwise. No other downloads.
#   scripts/install-deps.sh [--debian-only]   (--debian-only: the packages; the caller makes .venv/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python_env=("$root/scripts/python-env.sh")
case "${1:-}" in
  "") ;;
  --debian-only) python_env=(true) ;;
  *) echo "install-deps: unknown argument '$1'; use --debian-only or nothing" >&2; exit 2 ;;
esac

packages=(
  # build
  build-essential cmake ccache pkg-config git clang-14
  # libraries (found with find_package / pkg-config)
  libhdf5-dev libtbb-dev libxxhash-dev libcereal-dev libcli11-dev libfmt-dev
  libtomlplusplus-dev libpugixml-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  # tests and benchmarks: standard HDF5 readers, the PyTorch twin and peer
  hdf5-tools python3 python3-h5py python3-numpy python3-torch
  # the Python package (python/): its hashes, tests and a fresh virtual environment
  python3-xxhash python3-pytest python3-venv python3-setuptools python3-pip
  # the nightly HTML report opened in a headless browser; xxhsum checks goldens by hand
  chromium xxhash
  # fuzzing (scripts/fuzz.sh): libFuzzer and clang-14's sanitizer runtimes, only recommended
  # by clang-14 and so not installed with it here (--no-install-recommends)
  libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exec "${python_env[@]}"
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: missing packages (${missing[*]}) and neither root nor sudo; install them and rerun" >&2
  exit 2
fi
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
"${python_env[@]}"
