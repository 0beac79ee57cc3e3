#!/usr/bin/env bash
# The cpu-ref determinism contract across builds: the same receipt bits from
#   GCC Release -march=x86-64 (the reference), GCC Release -march=native,
#   GCC Debug (-O0), Clang 14 Release, and the portable kernels (GEMM, 4-lane elementwise).
# Each variant builds only the harness into build-matrix/<name>; receipts are compared
# with tests/cli/same_bits.py. Exit 0 when every variant matches, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${HARNESS_MATRIX_DIR:-$root/build-matrix}
mkdir -p "$out"
# tiny, llama-tiny and moe-tiny for a few steps (every op of the three architectures, the
# real shapes, moe's routing decisions) and micro for a whole run.
runs=("tiny 3" "llama-tiny 3" "moe-tiny 3" "micro 20")

build_variant() {  # name, build type, compiler, extra cmake args...
  local name=$1 type=$2 cxx=$3; shift 3
  cmake -S "$root" -B "$out/$name" -DCMAKE_BUILD_TYPE="$type" -DCMAKE_CXX_COMPILER="$cxx" \
    -DHARNESS_BUILD_TESTS=OFF -DHARNESS_BUILD_BENCH=OFF "$@" >/dev/null &&
    cmake --build "$out/$name" -j 2 --target harness >/dev/null
}

run_variant() {  # name: runs every entry of $runs with that build's harness
  local name=$1
  for r in "${runs[@]}"; do
    set -- $r
    "$out/$name/bin/harness" run --canary "$1" --steps "$2" --threads 2 --out "$out/$name-$1.h5" --force \
      >/dev/null 2>&1 || return 1
  done
}

status=0
build_variant gcc-release Release g++ || exit 1
run_variant gcc-release || exit 1
for variant in "gcc-native Release g++ -DHARNESS_NATIVE_ISA=ON" "gcc-debug Debug g++" "clang-release Release clang++-14"; do
  set -- $variant
  name=$1
  if ! build_variant "$@" || ! run_variant "$name"; then
    echo "FAIL $name: build or run failed"; status=1; continue
  fi
  for r in "${runs[@]}"; do
    canary=${r%% *}
    if /usr/bin/python3 "$root/tests/cli/same_bits.py" "$out/gcc-release-$canary.h5" "$out/$name-$canary.h5" >/dev/null; then
      echo "ok   $name $canary: bitwise identical to gcc-release"
    else
      echo "FAIL $name $canary: differs from gcc-release"; status=1
    fi
  done
done
# The portable kernels in the reference build: the std::fma GEMM and the 4-lane (SSE)
# elementwise kernels, where the reference run took the widest this CPU has.
for r in "${runs[@]}"; do
  set -- $r
  HARNESS_GEMM_KERNEL=generic HARNESS_ELEMENTWISE_KERNEL=sse-4 "$out/gcc-release/bin/harness" run --canary "$1" \
    --steps "$2" --threads 2 --out "$out/portable-$1.h5" --force >/dev/null 2>&1
  if /usr/bin/python3 "$root/tests/cli/same_bits.py" "$out/gcc-release-$1.h5" "$out/portable-$1.h5" >/dev/null; then
    echo "ok   portable-kernels $1: bitwise identical to gcc-release"
  else
    echo "FAIL portable-kernels $1: differs from gcc-release"; status=1
  fi
done
exit $status
