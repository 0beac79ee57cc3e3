#!/usr/bin/env bash
# Every GEMM kernel the CPU has (AVX-512F, AVX2+FMA, the portable std::fma one) and every
# width of the elementwise kernels (GELU, softmax's exp: 16, 8 or 4 lanes) gives bitwise
# identical receipts: what makes a golden from a baseline build valid on an FMA or AVX-512
# machine and back, for every architecture (gpt2's tiny, llama's llama-tiny: the GEMMs of
# q/k/v, gate/up and the untied head too). The manifest names the kernels that ran. The
# same width variable picks accel's element-wise loops (bf16 and fp8 rounding, the amax,
# the ordered split-K sums: numerics/isa_dispatch.h), checked on a bf16+fp8=all lane.
source "$(dirname "$0")/lib.sh"
kernels="generic"
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && kernels="$kernels avx2-fma"
grep -qw avx512f /proc/cpuinfo && kernels="$kernels avx512"
for canary in tiny llama-tiny; do
  "$HARNESS" run --canary $canary --steps 3 --out "$WORK/$canary-dispatch.h5" >/dev/null 2>&1 || fail "run ($canary, dispatch)"
  for kernel in $kernels; do
    receipt=$WORK/$canary-$kernel.h5
    HARNESS_GEMM_KERNEL=$kernel "$HARNESS" run --canary $canary --steps 3 --out "$receipt" >/dev/null 2>&1 ||
      fail "run ($canary, $kernel)"
    "$HARNESS" inspect "$receipt" | grep -q "gemm=$kernel" || fail "kernel $kernel not recorded in the manifest"
    $PY "$HERE/same_bits.py" "$WORK/$canary-dispatch.h5" "$receipt" ||
      fail "kernel $kernel disagrees with the dispatched one on $canary"
  done
done
widths="sse-4"
grep -qw avx2 /proc/cpuinfo && widths="$widths avx2-8"
grep -qw avx512f /proc/cpuinfo && widths="$widths avx512-16"
accel=(--engine accel --features bf16,fp8=all --noise-seed 7)
"$HARNESS" run "${accel[@]}" --steps 3 --out "$WORK/accel-dispatch.h5" >/dev/null 2>&1 || fail "run (accel, dispatch)"
for width in $widths; do
  HARNESS_ELEMENTWISE_KERNEL=$width "$HARNESS" run "${accel[@]}" --steps 3 --out "$WORK/accel-$width.h5" >/dev/null 2>&1 ||
    fail "run (accel, elementwise $width)"
  $PY "$HERE/same_bits.py" "$WORK/accel-dispatch.h5" "$WORK/accel-$width.h5" ||
    fail "elementwise width $width disagrees with the dispatched one on accel bf16+fp8=all"
  receipt=$WORK/tiny-$width.h5
  HARNESS_ELEMENTWISE_KERNEL=$width "$HARNESS" run --canary tiny --steps 3 --out "$receipt" >/dev/null 2>&1 ||
    fail "run (elementwise $width)"
  "$HARNESS" inspect "$receipt" | grep -q "elementwise=$width" || fail "elementwise kernel $width not recorded in the manifest"
  $PY "$HERE/same_bits.py" "$WORK/tiny-dispatch.h5" "$receipt" ||
    fail "elementwise kernel $width disagrees with the dispatched one on tiny"
done
finish
