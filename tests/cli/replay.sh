#!/usr/bin/env bash
# harness replay: a run with --checkpoint-every replays from the checkpoint at or before
# --from and reproduces every recorded hash bit for bit, on every engine (FP8 scaling state
# and seeded noise included); it costs the steps after the checkpoint, not the run. A
# tampered checkpoint or receipt is reported, never trusted. bisect replays a side that
# has no op trace to name the op.
source "$(dirname "$0")/lib.sh"
run() { "$HARNESS" run --canary micro --steps 12 --force "$@" >/dev/null 2>&1 || fail "run $*"; }

# expect_replay RECEIPT FROM RESUMED STEPS_RUN: exit 0, resumed from RESUMED, STEPS_RUN steps run
expect_replay() {
  expect_exit 0 "" -- "$HARNESS" replay "$1" --from "$2" --json
  "$PY" - "$WORK/stdout" "$3" "$4" <<'PY' || fail "replay $1 --from $2: $(cat "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "reproduced" and r["first_mismatch"] is None, r
assert r["resumed_from"] == int(sys.argv[2]) and r["steps_run"] == int(sys.argv[3]) and r["to"] == 11, r
PY
}

run --out "$WORK/ref.h5" --checkpoint-every 4
expect_replay "$WORK/ref.h5" 9 8 4
expect_replay "$WORK/ref.h5" 2 0 12
run --out "$WORK/fp8.h5" --checkpoint-every 4 --engine accel --features bf16,fp8=all --amax-history 4 --noise-seed 7
expect_replay "$WORK/fp8.h5" 10 8 4
run --out "$WORK/tp.h5" --checkpoint-every 4 --engine tpu-mesh --mesh 2x2 --shard-plan tp --grad-accum 1
expect_replay "$WORK/tp.h5" 5 4 8
expect_exit 0 "" -- "$HARNESS" replay "$WORK/tp.h5" --from 8 --to 9
grep -q "^verified    steps 8-9 bitwise equal to the receipt$" "$WORK/stdout" || fail "replay story: $(cat "$WORK/stdout")"

# FP8 scaling state is part of the checkpoint: without it the resumed steps quantise with
# other scales, and the replay says so
cp -r "$WORK/fp8.h5.ckpt" "$WORK/fp8-backup.ckpt"
"$PY" - "$WORK/fp8.h5.ckpt/step_000008.h5" "$WORK/fp8.h5" <<'PY'
import h5py, sys, subprocess
with h5py.File(sys.argv[1], "r+") as f:
    for name in list(f["engine"].keys()):
        if name.endswith("scale"):
            f["engine"][name][...] = 1.0
digest = subprocess.run(["xxhsum", "-H2", sys.argv[1]], capture_output=True, text=True).stdout.split()[0]
with h5py.File(sys.argv[2], "r+") as r:
    row = list(r["checkpoints/step"][:]).index(8)
    r["checkpoints/content_hash"][row] = ("xxh128:" + digest).encode()
PY
expect_exit 1 "" -- "$HARNESS" replay "$WORK/fp8.h5" --from 8
grep -q "^mismatch    step 8 differs from the receipt first in " "$WORK/stdout" || fail "scales not restored are not a mismatch: $(cat "$WORK/stdout")"

# a tampered checkpoint: its content hash is not the recorded one (exit 2, one line)
"$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    f['params/wte'][0] += 1e-3
" "$WORK/ref.h5.ckpt/step_000008.h5"
expect_exit 2 "step_000008.h5: content hash .* not trusted" -- "$HARNESS" replay "$WORK/ref.h5" --from 9
# ... and with the content hash forged in the receipt, its tensors still do not hash to the record
digest=$(xxhsum -H2 "$WORK/ref.h5.ckpt/step_000008.h5" | cut -d' ' -f1)
cp "$WORK/ref.h5" "$WORK/forged.h5"; cp -r "$WORK/ref.h5.ckpt" "$WORK/forged.h5.ckpt"
"$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as r:
    row = list(r['checkpoints/step'][:]).index(8)
    r['checkpoints/content_hash'][row] = ('xxh128:' + sys.argv[2]).encode()
" "$WORK/forged.h5" "$digest"
expect_exit 2 "params wte does not hash to the receipt's record of step 7" -- "$HARNESS" replay "$WORK/forged.h5" --from 9
mkdir "$WORK/moved" && cp "$WORK/ref.h5" "$WORK/moved/"  # the receipt without its <receipt>.ckpt/
expect_exit 2 "moved/ref.h5.ckpt/step_000008.h5: missing" -- "$HARNESS" replay "$WORK/moved/ref.h5" --from 9

# a tampered receipt: one recorded hash altered at step 10 is a mismatch at step 10 only;
# the replay agrees again at step 11, so the record was altered, not the run
run --out "$WORK/clean.h5" --checkpoint-every 4
"$PY" -c "
import h5py, numpy, sys
with h5py.File(sys.argv[1], 'r+') as f:
    h = f['hashes/adam_v'][...]
    h[10, 3] ^= numpy.uint64(1)
    f['hashes/adam_v'][...] = h
" "$WORK/clean.h5"
expect_exit 1 "" -- "$HARNESS" replay "$WORK/clean.h5" --from 9 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "an altered record is not diagnosed: $(cat "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "record_altered" and r["mismatched_steps"] == [10], r
assert r["first_mismatch"] == {"step": 10, "what": "adam_v", "tensor": "blocks.0.ln1.bias"}, r
PY

# bad input: steps out of range, racy noise, a receipt without a recipe
expect_exit 2 "--from: step 12 is not recorded" -- "$HARNESS" replay "$WORK/ref.h5" --from 12
expect_exit 2 "--to: step 3 is not in 5-11" -- "$HARNESS" replay "$WORK/ref.h5" --from 5 --to 3
run --out "$WORK/racy.h5" --engine accel --noise racy
expect_exit 2 "engine accel with noise=racy orders its reductions as its threads finish and cannot be replayed" -- "$HARNESS" replay "$WORK/racy.h5"
"$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    del f['manifest'].attrs['run_options']
" "$WORK/racy.h5"
expect_exit 2 "no run_options" -- "$HARNESS" replay "$WORK/racy.h5"
for recipe in '[1]' '{}'; do
  "$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    f['manifest'].attrs.create('run_options', sys.argv[2].encode(), dtype=h5py.string_dtype('utf-8', len(sys.argv[2])))
" "$WORK/racy.h5" "$recipe"
  expect_exit 2 "racy.h5: /manifest/run_options: not a replay recipe \\((not a JSON object|key 'canary' not found)\\); the receipt is damaged" -- \
    "$HARNESS" replay "$WORK/racy.h5"
done
# a recipe's numbers in the ranges the run's own flags allow, named otherwise (a thread
# count of 10**9 once ended in std::bad_alloc; a seed of 2**70 in a mismatch)
for change in "threads=10**9:key 'threads' is 1000000000, not an integer in 0..1024" \
              "seed=2**70:key 'seed' is 1.1805916207174113e\\+21, not an integer in 0..9223372036854775807" \
              "seed=1.5:key 'seed' is 1.5, not an integer" "checkpoint_every=-1:key 'checkpoint_every' is -1" \
              "trace='bogus':key 'trace': 'bogus' is not a trace level; use none or ops" \
              "engine='bogus':holds what .harness run. refuses \\(--engine: unknown engine 'bogus'" "inject_fault='step=x':--inject-fault: step='x'"; do
  cp "$WORK/ref.h5" "$WORK/recipe.h5"
  "$PY" - "$WORK/recipe.h5" "${change%%:*}" <<'PY' || fail "could not change the recipe"
import h5py, json, sys
key, value = sys.argv[2].split("=", 1)
with h5py.File(sys.argv[1], "r+") as f:
    recipe = json.loads(f["manifest"].attrs["run_options"])
    recipe[key] = eval(value)
    text = json.dumps(recipe).encode()
    f["manifest"].attrs.create("run_options", text, dtype=h5py.string_dtype("utf-8", len(text)))
PY
  expect_exit 2 "recipe.h5: /manifest/run_options.*${change#*:}.*; the receipt is damaged" -- "$HARNESS" replay "$WORK/recipe.h5"
done
expect_exit 2 "" -- "$HARNESS" replay "$WORK/none.h5"
# a receipt that does not validate is refused before its rows are used (an empty
# /steps/grad_norm once crashed the replay)
cp "$WORK/ref.h5" "$WORK/empty_rows.h5"
"$PY" -c "
import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    del f['steps/grad_norm']
    f.create_dataset('steps/grad_norm', shape=(0,), maxshape=(None,), dtype='<f8', chunks=(128,))
" "$WORK/empty_rows.h5"
expect_exit 2 "empty_rows.h5: /steps/grad_norm: has shape \\(0\\)" -- "$HARNESS" replay "$WORK/empty_rows.h5"

# bisect: the faulted side has no op trace; bisect replays it with tracing on to name the op
run --out "$WORK/traced.h5" --trace ops
run --out "$WORK/fault.h5" --checkpoint-every 4 --inject-fault step=5,op=blocks.1.mlp.fc
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/fault.h5" "$WORK/traced.h5" --json
"$PY" - "$WORK/stdout" <<'PY' || fail "bisect does not replay the untraced side: $(cat "$WORK/stdout")"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["first_divergent_step"] == 5 and b["op_trace"] == "replay of A", b
assert b["first_divergent_op"]["name"] == "blocks.1.mlp.fc" and b["first_divergent_op"]["phase"] == "forward", b
PY
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/fault.h5" "$WORK/traced.h5" --no-replay
grep -q "^first op    unknown: .*has no op trace" "$WORK/stdout" || fail "--no-replay: $(cat "$WORK/stdout")"
finish
