#!/usr/bin/env bash
# Canary files (docs/canary-files.md) from the command line: a shipped canary by name and a
# copy of its file by path are the same canary, bit for bit; a canary trained on a user's
# token file is deterministic across thread counts, replays and exports its windows; a bad
# canary file or token file is exit 2 with one line naming the file and the key.
source "$(dirname "$0")/lib.sh"
SHIPPED="$HERE/../../canaries"
run() { "$HARNESS" run --force "$@" >/dev/null 2>"$WORK/run.err" || fail "run $*: $(cat "$WORK/run.err")"; }

# By name and by path: one canary, one lane name, the same bits.
cp "$SHIPPED/micro.toml" "$WORK/copy.toml"
run --canary micro --steps 4 --out "$WORK/by-name.h5"
run --canary "$WORK/copy.toml" --steps 4 --out "$WORK/by-path.h5"
"$PY" "$HERE/same_bits.py" "$WORK/by-name.h5" "$WORK/by-path.h5" || fail "micro by name and by path differ"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/by-name.h5" "$WORK/by-path.h5"
"$PY" - "$WORK/by-path.h5" "$WORK/copy.toml" <<'PY' || fail "the receipt of a canary file does not record its lane or recipe"
import json, sys, h5py
attrs = h5py.File(sys.argv[1], "r")["manifest"].attrs
m = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
assert m["lane"] == "micro/cpu-ref", m["lane"]
assert json.loads(m["run_options"])["canary"] == sys.argv[2], m["run_options"]
PY

# The canary's [train] seed is the run's seed unless --seed says otherwise.
sed 's/^steps = 20$/steps = 20\nseed = 99/' "$SHIPPED/micro.toml" > "$WORK/seeded.toml"
run --canary "$WORK/seeded.toml" --steps 2 --out "$WORK/seeded.h5"
run --canary micro --steps 2 --seed 99 --out "$WORK/seed99.h5"
"$PY" "$HERE/same_bits.py" "$WORK/seeded.h5" "$WORK/seed99.h5" || fail "[train] seed = 99 is not --seed 99"

# Your own tokens: a vocabulary larger than a byte, uint16 ids, any thread count.
"$PY" - "$WORK/tokens.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(5)
walk = np.cumsum(rng.integers(-3, 4, 5000)) % 300  # learnable: small steps on a ring
walk.astype("<u2").tofile(sys.argv[1])
PY
cat > "$WORK/mine.toml" <<'TOML'
schema_version = 1
name = "mine"
architecture = "gpt2"
[model]
vocab = 300
context = 24
channels = 48
layers = 2
heads = 3
[train]
batch = 4
steps = 12
seed = 7
[data]
source = "tokens"
path = "tokens.bin"
dtype = "uint16"
TOML
run --canary "$WORK/mine.toml" --threads 1 --checkpoint-every 4 --out "$WORK/mine-1.h5"
run --canary "$WORK/mine.toml" --threads 2 --out "$WORK/mine-2.h5"
"$PY" "$HERE/same_bits.py" "$WORK/mine-1.h5" "$WORK/mine-2.h5" || fail "the token canary differs across thread counts"
"$PY" - "$WORK/mine-1.h5" <<'PY' || fail "the token canary did not learn"
import sys, h5py
loss = h5py.File(sys.argv[1], "r")["steps/loss"][:]
assert loss[-1] < loss[0] - 0.3, loss
PY
expect_exit 0 "" -- "$HARNESS" replay "$WORK/mine-1.h5" --from 5
expect_exit 0 "" -- "$HARNESS" export --canary "$WORK/mine.toml" --steps 3 --out "$WORK/mine-pack.h5"
"$PY" - "$WORK/mine-pack.h5" "$WORK/tokens.bin" <<'PY' || fail "the pack's batches are not the token file's windows"
import json, sys, h5py, numpy as np
pack = h5py.File(sys.argv[1], "r")
ids = np.fromfile(sys.argv[2], dtype="<u2").astype(np.int32)
canary = json.loads(pack["manifest"].attrs["canary"])
assert canary["data_source"] == "tokens" and canary["data_tokens_count"] == len(ids), canary
B, T = 4, 24
tokens = pack["batches/tokens"][:].reshape(3, B, T + 1)
for s in range(3):
    for b in range(B):
        start = ((s * B + b) * T) % (len(ids) - T - 1)
        assert (tokens[s, b] == ids[start:start + T + 1]).all(), (s, b)
PY
# Budgets per canary: the default entries were calibrated on tiny; a comparison of mine
# that needs a tolerance names the entries mine lacks, and its own entries make it pass.
run --canary "$WORK/mine.toml" --engine accel --noise seeded --steps 4 --out "$WORK/mine-accel.h5"
run --canary "$WORK/mine.toml" --steps 4 --out "$WORK/mine-ref.h5"
expect_exit 2 "no budget for canary 'mine' in .*budgets.toml: \[mine.noise\] missing" -- \
  "$HARNESS" compare "$WORK/mine-accel.h5" "$WORK/mine-ref.h5"
{ cat "$SHIPPED/budgets.toml"; printf '\n[mine.noise]\nform = "tolerance"\nrationale = "test"\ncalibrated = "2026-11-23"\n'
  printf 'repeats = 1\nloss = [ { steps = "0-", atol = 1e-3 } ]\ngrad_norm = [ { steps = "0-", rtol = 1e-3 } ]\n'
  printf 'params_sketch = [ { steps = "0-", atol = 1.0, rtol = 0.1 } ]\n'; } > "$WORK/mine-budgets.toml"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/mine-accel.h5" "$WORK/mine-ref.h5" --budgets "$WORK/mine-budgets.toml"
grep -q "mine.noise" "$WORK/stdout" || fail "compare does not name the entry it used: $(cat "$WORK/stdout")"

# A token file that changed since the receipt: the replay refuses to train on other data.
"$PY" -c "import numpy as np; np.full(5000, 1, '<u2').tofile('$WORK/tokens.bin')"
expect_exit 2 "mine-1.h5: canary .* changed since the receipt was recorded" -- "$HARNESS" replay "$WORK/mine-1.h5" --from 5

# A llama canary (a small copy of llama-tiny): bitwise across thread counts on cpu-ref,
# fault injection by op name, on accel with bf16 and every FP8 zone, on tpu-mesh.
sed -e 's/^name = "llama-tiny"/name = "llama-small"/' -e 's/^context = 64/context = 16/' -e 's/^channels = 128/channels = 48/' \
    -e 's/^layers = 4/layers = 2/' -e 's/^mlp_hidden = 352/mlp_hidden = 96/' -e 's/^batch = 8/batch = 2/' \
    "$SHIPPED/llama-tiny.toml" > "$WORK/llama-small.toml"
run --canary "$WORK/llama-small.toml" --steps 6 --threads 1 --trace ops --out "$WORK/llama-1.h5"
run --canary "$WORK/llama-small.toml" --steps 6 --threads 2 --trace ops --out "$WORK/llama-2.h5"
"$PY" "$HERE/same_bits.py" "$WORK/llama-1.h5" "$WORK/llama-2.h5" || fail "the llama canary differs across thread counts"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/llama-1.h5"
run --canary "$WORK/llama-small.toml" --steps 6 --trace ops --inject-fault step=3,op=blocks.1.mlp.swiglu \
  --out "$WORK/llama-fault.h5"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/llama-fault.h5" "$WORK/llama-1.h5"
grep -q "step 3" "$WORK/stdout" && grep -q "blocks.1.mlp.swiglu" "$WORK/stdout" \
  || fail "bisect does not name step 3 and the faulted llama op: $(cat "$WORK/stdout")"
run --canary "$WORK/llama-small.toml" --steps 3 --engine accel --features bf16,fp8=all --out "$WORK/llama-accel.h5"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/llama-accel.h5"
# llama-tiny on accel under its own calibrated entries of the shipped budgets (llama-tiny is
# not among the canaries the default entries budget).
run --canary llama-tiny --steps 4 --out "$WORK/llama-tiny-ref.h5"
run --canary llama-tiny --steps 4 --engine accel --features bf16,fp8=all --out "$WORK/llama-tiny-fp8.h5"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/llama-tiny-fp8.h5" "$WORK/llama-tiny-ref.h5"
grep -q "budget      llama-tiny.bf16 + llama-tiny.fp8 + llama-tiny.noise" "$WORK/stdout" \
  || fail "llama-tiny's accel lane is not judged by its own entries: $(cat "$WORK/stdout")"
# tpu-mesh on one device is cpu-ref bit for bit on the llama canary too; a tensor-parallel
# mesh whose model axis would split a head is refused before step 0, naming the tensor.
run --canary "$WORK/llama-small.toml" --steps 6 --engine tpu-mesh --shard-plan tp --trace ops \
  --out "$WORK/llama-mesh.h5"
"$PY" "$HERE/same_bits.py" "$WORK/llama-1.h5" "$WORK/llama-mesh.h5" || fail "tpu-mesh 1x1 differs from cpu-ref on llama"
run --canary "$WORK/llama-small.toml" --steps 3 --engine tpu-mesh --mesh 2x2 --shard-plan tp --out "$WORK/llama-tp.h5"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/llama-tp.h5"
# Fault injection and op traces by op name on the sharded program: bisect names the op.
run --canary "$WORK/llama-small.toml" --steps 5 --engine tpu-mesh --mesh 1x2 --shard-plan tp --trace ops \
  --out "$WORK/llama-tp-traced.h5"
run --canary "$WORK/llama-small.toml" --steps 5 --engine tpu-mesh --mesh 1x2 --shard-plan tp --trace ops \
  --inject-fault step=3,op=blocks.1.attn.rope_k --out "$WORK/llama-tp-fault.h5"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/llama-tp-fault.h5" "$WORK/llama-tp-traced.h5"
grep -q "first op    blocks.1.attn.rope_k forward" "$WORK/stdout" \
  || fail "bisect on tpu-mesh tp does not name the faulted llama op: $(cat "$WORK/stdout")"
expect_exit 2 "--shard-plan tp on --mesh 1x4: blocks.0.attn.k.weight dimension 0 has size 24, which does not divide into 4 shards of whole heads \(12 wide\)" -- \
  "$HARNESS" run --canary "$WORK/llama-small.toml" --engine tpu-mesh --mesh 1x4 --shard-plan tp --out "$WORK/bad.h5"

# A moe canary (a small copy of moe-tiny): bitwise across thread counts on cpu-ref, its
# routing in /routing (every choice placed or dropped), fault injection by a moe op name
# found by bisect.
sed -e 's/^name = "moe-tiny"/name = "moe-small"/' -e 's/^context = 64/context = 16/' -e 's/^channels = 128/channels = 48/' \
    -e 's/^layers = 4/layers = 2/' -e 's/^mlp_hidden = 176/mlp_hidden = 40/' -e 's/^batch = 8/batch = 2/' \
    "$SHIPPED/moe-tiny.toml" > "$WORK/moe-small.toml"
run --canary "$WORK/moe-small.toml" --steps 6 --threads 1 --trace ops --out "$WORK/moe-1.h5"
run --canary "$WORK/moe-small.toml" --steps 6 --threads 2 --trace ops --out "$WORK/moe-2.h5"
"$PY" "$HERE/same_bits.py" "$WORK/moe-1.h5" "$WORK/moe-2.h5" || fail "the moe canary differs across thread counts"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/moe-1.h5"
"$PY" - "$WORK/moe-1.h5" "$WORK/moe-2.h5" <<'PY' || fail "the moe canary's /routing does not account for every choice"
import sys, h5py, numpy as np
one, two = (h5py.File(p, "r")["routing"] for p in sys.argv[1:])
assert [n.decode() for n in one["names"][:]] == ["blocks.0.moe.route", "blocks.1.moe.route"]
placed = sum(one[f"tokens_expert_{e}"][:] for e in range(4))
assert (placed + one["dropped"][:] == 2 * 16 * 2).all(), placed  # B*T tokens x 2 choices, each step and layer
assert (one["decisions_hash"][:] == two["decisions_hash"][:]).all()
PY
run --canary "$WORK/moe-small.toml" --steps 6 --trace ops --inject-fault step=3,op=blocks.1.moe.experts.swiglu \
  --out "$WORK/moe-fault.h5"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/moe-fault.h5" "$WORK/moe-1.h5"
grep -q "first op    blocks.1.moe.experts.swiglu forward" "$WORK/stdout" \
  || fail "bisect does not name the faulted moe op: $(cat "$WORK/stdout")"
# moe-tiny's reference lane equals its golden bit for bit (canaries/moe-nightly.toml; cpu-ref
# bits are the same on every x86-64 CPU), its routing recorded with it.
expect_exit 0 "" -- "$HARNESS" nightly --matrix "$SHIPPED/moe-nightly.toml" --lanes cpu-ref --out "$WORK/moe-nightly"
grep -q "golden pass: bitwise equal" "$WORK/stderr" || fail "moe-tiny's cpu-ref is not bitwise its golden: $(cat "$WORK/stderr")"
# Every initial weight of moe-tiny one ulp away: the runs part at step 0, and some step later
# a layer routes a choice to another expert; bisect names that step and layer, as the
# receipts' /routing says independently.
run --canary moe-tiny --perturb-init 1 --out "$WORK/moe-perturbed.h5"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/moe-perturbed.h5" "$WORK/moe-nightly/receipts/cpu-ref.h5"
grep -E "^decisions   step [0-9]+: blocks\.[0-9]+\.moe\.route decided otherwise first" "$WORK/stdout" > "$WORK/flip.txt" \
  || fail "bisect does not name the first routing flip: $(cat "$WORK/stdout")"
"$PY" - "$WORK/moe-perturbed.h5" "$WORK/moe-nightly/receipts/cpu-ref.h5" "$WORK/flip.txt" <<'PY' || fail "bisect's routing flip is not the receipts' first"
import re, sys, h5py, numpy as np
a, b = (h5py.File(p, "r")["routing"] for p in sys.argv[1:3])
differs = a["decisions_hash"][:] != b["decisions_hash"][:]
step = int(np.argmax(differs.any(axis=1)))
layer = a["names"][int(np.argmax(differs[step]))].decode()
said = re.search(r"step (\d+): (\S+) decided otherwise first .*at least (\d+) choices? moved", open(sys.argv[3]).read())
assert said and (int(said[1]), said[2]) == (step, layer), (said and said.groups(), step, layer)
buckets = [k for k in a if k.startswith("tokens_expert_")] + ["dropped"]
column = int(np.argmax(differs[step]))
moved = sum(abs(a[k][step, column] - b[k][step, column]) for k in buckets) / 2
assert int(said[3]) == moved >= 1, (said[3], moved)
PY
# A 1-ulp fault in layer 0's router logits at step 5: bisect names the faulted op at step 5
# (both receipts traced: the matrix traces ops) and, apart, the step where the fault's
# consequences first sent a token to another expert (87: a chaotic, fixed consequence on
# every x86-64 CPU, since cpu-ref's bits are portable).
run --canary moe-tiny --trace ops --inject-fault step=5,op=blocks.0.moe.router,ulps=1 --out "$WORK/moe-router-fault.h5"
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/moe-router-fault.h5" "$WORK/moe-nightly/receipts/cpu-ref.h5"
grep -q "^first op    blocks.0.moe.router forward, layer 0" "$WORK/stdout" \
  || fail "bisect does not name the faulted router: $(cat "$WORK/stdout")"
grep -q "^diverges    step 5 " "$WORK/stdout" || fail "bisect does not name the fault's step: $(cat "$WORK/stdout")"
grep -q "^decisions   step 87: blocks.0.moe.route decided otherwise first" "$WORK/stdout" \
  || fail "bisect does not name the routing flip the fault caused: $(cat "$WORK/stdout")"
# accel runs moe with bf16 and FP8 in the attention's zones; a zone that covers no weight
# (moe's experts are in none yet) is refused before step 0. tpu-mesh runs it: expert
# parallelism moves rows, never values (bitwise dp on the same mesh); a mesh whose data
# axis does not divide the experts, and micro-batches, are refused before step 0.
run --canary "$WORK/moe-small.toml" --steps 3 --engine accel --features bf16,fp8=qkv,attn_proj --out "$WORK/moe-accel.h5"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/moe-accel.h5"
expect_exit 2 "--features: FP8 zone mlp_fc covers no weight of this canary" -- \
  "$HARNESS" run --canary "$WORK/moe-small.toml" --engine accel --features bf16,fp8=all --out "$WORK/moe-fp8.h5"
run --canary "$WORK/moe-small.toml" --steps 3 --engine tpu-mesh --mesh 2x1 --shard-plan ep --out "$WORK/moe-ep.h5"
run --canary "$WORK/moe-small.toml" --steps 3 --engine tpu-mesh --mesh 2x1 --shard-plan dp --out "$WORK/moe-dp.h5"
"$PY" "$HERE/same_bits.py" "$WORK/moe-ep.h5" "$WORK/moe-dp.h5" || fail "tpu-mesh's ep changed a value of dp"
expect_exit 0 "" -- "$HARNESS" validate "$WORK/moe-ep.h5"
expect_exit 2 "experts.gate.weight dimension 0 has size 4, which does not divide into 8 shards" -- \
  "$HARNESS" run --canary "$WORK/moe-small.toml" --engine tpu-mesh --mesh 8x1 --shard-plan ep --out "$WORK/moe-mesh.h5"
expect_exit 2 "--grad-accum 2: blocks.0.moe.dispatch.out holds every expert's rows" -- \
  "$HARNESS" run --canary "$WORK/moe-small.toml" --engine tpu-mesh --grad-accum 2 --out "$WORK/moe-accum.h5"
for refused in moe-fp8 moe-mesh moe-accum; do
  [ ! -e "$WORK/$refused.h5" ] || fail "a refused moe run left $WORK/$refused.h5"
done

# Bad canary files: exit 2, one line with the file and the key, no receipt.
sed 's/^heads = 2$/heads = 3/' "$SHIPPED/micro.toml" > "$WORK/bad-heads.toml"
expect_exit 2 "bad-heads.toml: model.heads: 3 does not divide model.channels 32" -- \
  "$HARNESS" run --canary "$WORK/bad-heads.toml" --out "$WORK/bad.h5"
sed 's/^vocab = 300$/vocab = 200/' "$WORK/mine.toml" > "$WORK/small-vocab.toml"
"$PY" -c "import numpy as np; a = np.zeros(500, '<u2'); a[321] = 250; a.tofile('$WORK/tokens.bin')"
expect_exit 2 "small-vocab.toml: data.path: .*token 250 at byte offset 642 \(token 321\) is not below model.vocab 200" -- \
  "$HARNESS" export --canary "$WORK/small-vocab.toml" --steps 2 --out "$WORK/bad-pack.h5"
sed 's|^path = "tokens.bin"$|path = "/dev/zero"|' "$WORK/mine.toml" > "$WORK/device-tokens.toml"
expect_exit 2 "device-tokens.toml: data.path: '/dev/zero' is not a regular file" -- \
  "$HARNESS" run --canary "$WORK/device-tokens.toml" --out "$WORK/bad.h5"
expect_exit 2 "nowhere.toml: no such canary file" -- "$HARNESS" run --canary "$WORK/nowhere.toml" --out "$WORK/bad.h5"
[ ! -e "$WORK/bad.h5" ] && [ ! -e "$WORK/bad-pack.h5" ] || fail "a refused canary left a file behind"
finish
