#!/usr/bin/env bash
# The AVX2+FMA GEMM and the portable std::fma GEMM give bitwise identical receipts:
# what makes a golden from a baseline build valid on an FMA machine and back.
source "$(dirname "$0")/lib.sh"
"$HARNESS" run --canary tiny --steps 3 --out "$WORK/dispatch.h5" >/dev/null 2>&1 || fail "run (dispatch)"
HARNESS_GEMM_KERNEL=generic "$HARNESS" run --canary tiny --steps 3 --out "$WORK/generic.h5" >/dev/null 2>&1 || fail "run (generic)"
"$HARNESS" inspect "$WORK/generic.h5" | grep -q "gemm=generic" || fail "generic kernel not recorded in the manifest"
$PY "$HERE/same_bits.py" "$WORK/dispatch.h5" "$WORK/generic.h5" || fail "kernels disagree"
finish
