#!/usr/bin/env bash
# accel from the command line: a seeded run's manifest names its noise_seed, and
# --noise-seed replays the run bit for bit at another thread count; the /fp8 group holds
# one amax and one scale per zone instance and role per step, readable by h5py.
source "$(dirname "$0")/lib.sh"
run=("$HARNESS" run --canary tiny --steps 3 --engine accel --features bf16,fp8=qkv,mlp_proj)

expect_exit 0 "" -- "${run[@]}" --threads 2 --out "$WORK/first.h5"
seed=$("$HARNESS" inspect --json "$WORK/first.h5" | $PY -c 'import json,sys; print(json.load(sys.stdin)["manifest"]["noise_seed"])')
[ -n "$seed" ] || fail "no noise_seed in the manifest"
grep -q "lane        tiny/accel+bf16+fp8=qkv,mlp_proj" <("$HARNESS" inspect "$WORK/first.h5") || fail "lane name"

expect_exit 0 "" -- "${run[@]}" --threads 1 --noise-seed "$seed" --out "$WORK/replay.h5"
$PY "$HERE/same_bits.py" "$WORK/first.h5" "$WORK/replay.h5" >/dev/null || fail "replay with --noise-seed $seed differs"

$PY - "$WORK/first.h5" <<'PYEOF' || fail "/fp8 group"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
names = [n.decode() for n in f["fp8/names"][:]]
# tiny has 4 layers, two zones each, three roles each
assert len(names) == 4 * 2 * 3, names
assert names[:3] == ["blocks.0.attn.qkv/input", "blocks.0.attn.qkv/weight", "blocks.0.attn.qkv/grad_output"], names
assert f["fp8/amax"].shape == (3, 24) and f["fp8/scale"].shape == (3, 24)
scale = f["fp8/scale"][:]
assert (scale[0] == 1).all(), "delayed scaling starts at scale 1"
assert (scale[1] != 1).all(), "step 1 uses scales from step 0's amax"
assert np.allclose(scale[1][0::3], 448 / f["fp8/amax"][0][0::3]), "input scale = e4m3 max / amax"
assert np.allclose(scale[1][2::3], 57344 / f["fp8/amax"][0][2::3]), "grad_output scale = e5m2 max / amax"
PYEOF
finish
