#!/usr/bin/env bash
# The independent PyTorch twin (torch_twin.py) replays cpu-ref's 100 steps of `tiny` from
# the receipt's dumped initial weights and recorded batches, and must agree on every loss
# and on the parameters at steps 50 and 100. Tolerances are about 4x and 2.5x the
# agreement measured when they were set (loss 4.6e-7 relative, parameters 8e-5 absolute;
# docs/canary.md, "External twin"). Then the same for tiny with the exact GELU
# (`model.gelu = "erf"`: the op gelu_erf_*, torch's F.gelu(approximate="none")), under the
# same tolerances.
set -u
HARNESS=${1:?usage: $0 path/to/harness}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${TWIN_STEPS:-100}
twin() {  # twin CANARY NAME: cpu-ref's run of CANARY, replayed by the twin
  "$HARNESS" run --canary "$1" --steps "$STEPS" --dump-tensors "0,$((STEPS / 2)),$STEPS" --record-batches \
    --out "$WORK/$2.h5" >/dev/null || exit 1
  /usr/bin/python3 "$HERE/torch_twin.py" "$WORK/$2.h5" --loss-rtol 2e-6 --param-atol 2e-4 || exit 1
}
twin tiny tiny
sed 's/^name = "tiny"$/name = "tiny-erf"/; s/^\[model\]$/[model]\ngelu = "erf"/' "$HERE/../../canaries/tiny.toml" \
  >"$WORK/tiny-erf.toml"
grep -q '^gelu = "erf"$' "$WORK/tiny-erf.toml" || { echo "FAIL: no gelu key in $WORK/tiny-erf.toml" >&2; exit 1; }
twin "$WORK/tiny-erf.toml" tiny-erf
