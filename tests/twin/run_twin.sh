#!/usr/bin/env bash
# The independent PyTorch twin (torch_twin.py) replays cpu-ref's first steps of `tiny` from
# the receipt's dumped initial weights and recorded batches, and must agree on every loss
# and on the parameters after the last replayed step.
set -u
HARNESS=${1:?usage: $0 path/to/harness}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${TWIN_STEPS:-8}
"$HARNESS" run --canary tiny --steps "$STEPS" --dump-tensors "0,$STEPS" --record-batches --out "$WORK/tiny.h5" >/dev/null || exit 1
/usr/bin/python3 "$HERE/torch_twin.py" "$WORK/tiny.h5" --loss-rtol 1e-5 --param-atol 1e-5
