#!/usr/bin/env bash
# Every GEMM kernel the CPU has (AVX-512F, AVX2+FMA, the portable std::fma one) gives
# bitwise identical receipts: what makes a golden from a baseline build valid on an FMA or
# AVX-512 machine and back. The manifest names the kernel that ran.
source "$(dirname "$0")/lib.sh"
"$HARNESS" run --canary tiny --steps 3 --out "$WORK/dispatch.h5" >/dev/null 2>&1 || fail "run (dispatch)"
kernels="generic"
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && kernels="$kernels avx2-fma"
grep -qw avx512f /proc/cpuinfo && kernels="$kernels avx512"
for kernel in $kernels; do
  HARNESS_GEMM_KERNEL=$kernel "$HARNESS" run --canary tiny --steps 3 --out "$WORK/$kernel.h5" >/dev/null 2>&1 || fail "run ($kernel)"
  "$HARNESS" inspect "$WORK/$kernel.h5" | grep -q "gemm=$kernel" || fail "kernel $kernel not recorded in the manifest"
  $PY "$HERE/same_bits.py" "$WORK/dispatch.h5" "$WORK/$kernel.h5" || fail "kernel $kernel disagrees with the dispatched one"
done
finish
