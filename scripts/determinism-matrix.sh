#!/usr/bin/env bash
# The cpu-ref determinism contract across builds: the same receipt bits from
#   GCC Release -march=x86-64 (the reference), GCC Release -march=native,
#   GCC Debug (-O0), Clang 14 Release (or -O1 sanitized), and the portable kernels (GEMM,
#   4-lane elementwise).
# Each variant builds only the harness into build-matrix/<name>; receipts are compared
# with tests/cli/same_bits.py. Exit 0 when every variant matches, 1 otherwise; 2 when
# a prebuilt variant (below) is not configured as that variant is.
#   HARNESS_MATRIX_REFERENCE=DIR  the reference is the harness of an existing build tree
#   (README command 2's build/) instead of a build of its own: it must
#   be GCC, Release, -march=x86-64 and unsanitized, which its CMakeCache.txt says.
#   HARNESS_MATRIX_FOLD=1  the ISA and optimization-level variants in one build, GCC Debug
#   (-O0) -march=native, instead of gcc-native and gcc-debug: either moving a bit fails it
#   (the full matrix then says which); one build less.
#   HARNESS_MATRIX_CLANG=DIR  the Clang variant is an existing Clang 14 build instead of
#   clang-release (scripts/test.sh --sanitize's build-asan/, at -O1 with ASan and UBSan,
#   which move no floating-point bit): another compiler at another optimization level.
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

# prebuilt VARIABLE NAME COMPILER_ID CACHE_LINES...: the harness of the build tree that
# $VARIABLE names, as build-matrix/NAME, when its compiler (CMake's id) and cache lines are
# the variant's; exit 2 and say which is not.
prebuilt() {
  local variable=$1 name=$2 compiler=$3 dir=${!1} want; shift 3
  [ -x "$dir/bin/harness" ] && [ -f "$dir/CMakeCache.txt" ] ||
    { echo "determinism-matrix: $variable=$dir holds no built bin/harness; build it or unset $variable" >&2; return 2; }
  grep -qs "set(CMAKE_CXX_COMPILER_ID \"$compiler\")" "$dir"/CMakeFiles/*/CMakeCXXCompiler.cmake ||
    { echo "determinism-matrix: $variable=$dir was not built by $compiler; unset $variable to build $name" >&2; return 2; }
  for want in "$@"; do
    grep -qx "$want" "$dir/CMakeCache.txt" ||
      { echo "determinism-matrix: $variable=$dir is not configured as $name is (wants $want); unset $variable to build it" >&2; return 2; }
  done
  mkdir -p "$out/$name/bin" && ln -sfn "$(cd "$dir" && pwd)/bin/harness" "$out/$name/bin/harness"
  echo "$name: $dir/bin/harness"
}

# A sanitized variant's runs: HDF5's known leaks only (scripts/lsan.supp; none on a valid run).
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp:print_suppressions=0}
status=0
if [ -n "${HARNESS_MATRIX_REFERENCE:-}" ]; then
  prebuilt HARNESS_MATRIX_REFERENCE gcc-release GNU 'CMAKE_BUILD_TYPE:STRING=Release' 'HARNESS_NATIVE_ISA:BOOL=OFF' \
    'HARNESS_SANITIZE:BOOL=OFF' 'HARNESS_TSAN:BOOL=OFF' 'HARNESS_BUILD_FUZZERS:BOOL=OFF' || exit 2
else
  build_variant gcc-release Release g++ || exit 1
fi
run_variant gcc-release || exit 1
variants=("gcc-native Release g++ -DHARNESS_NATIVE_ISA=ON" "gcc-debug Debug g++")
[ "${HARNESS_MATRIX_FOLD:-0}" = 1 ] && variants=("gcc-debug-native Debug g++ -DHARNESS_NATIVE_ISA=ON")
if [ -n "${HARNESS_MATRIX_CLANG:-}" ]; then
  prebuilt HARNESS_MATRIX_CLANG clang-O1-sanitized Clang 'CMAKE_CXX_FLAGS_RELEASE:STRING=-O1' 'HARNESS_SANITIZE:BOOL=ON' || exit 2
  variants+=("clang-O1-sanitized prebuilt")
else
  variants+=("clang-release Release clang++-14")
fi
for variant in "${variants[@]}"; do
  set -- $variant
  name=$1
  if { [ "$2" != prebuilt ] && ! build_variant "$@"; } || ! run_variant "$name"; then
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
