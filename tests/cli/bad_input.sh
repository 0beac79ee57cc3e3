#!/usr/bin/env bash
# Bad input: exit 2, one line naming the flag/file and the fix, nothing left behind.
source "$(dirname "$0")/lib.sh"
out="$WORK/runs"; mkdir -p "$out"

expect_exit 2 "--bogus"              -- "$HARNESS" run --canary micro --bogus --out "$out/a.h5"
expect_exit 2 "unknown engine 'gpu'" -- "$HARNESS" run --canary micro --engine gpu --out "$out/a.h5"
expect_exit 2 "unknown canary 'huge'" -- "$HARNESS" run --canary huge --out "$out/a.h5"
expect_exit 2 "--threads"            -- "$HARNESS" run --canary micro --threads -1 --out "$out/a.h5"
expect_exit 2 "--threads"            -- "$HARNESS" run --canary micro --threads many --out "$out/a.h5"
expect_exit 2 "--steps"              -- "$HARNESS" run --canary micro --steps 0 --out "$out/a.h5"
expect_exit 2 "--seed"               -- "$HARNESS" run --canary micro --seed -5 --out "$out/a.h5"
expect_exit 2 "--out"                -- "$HARNESS" run --canary micro
expect_exit 2 "is a directory"       -- "$HARNESS" run --canary micro --out "$out"
expect_exit 2 "does not exist"       -- "$HARNESS" run --canary micro --out "$WORK/nowhere/a.h5"
expect_exit 2 "unknown op 'blocks.9.mlp.fc'" -- "$HARNESS" run --canary micro --inject-fault step=3,op=blocks.9.mlp.fc --out "$out/a.h5"
expect_exit 2 "past the last step"   -- "$HARNESS" run --canary micro --inject-fault step=50,op=blocks.0.ln1 --out "$out/a.h5"
expect_exit 2 "--dump-tensors"       -- "$HARNESS" run --canary micro --dump-tensors 1,x --out "$out/a.h5"
expect_exit 2 "--dump-tensors"       -- "$HARNESS" run --canary micro --dump-tensors 21 --out "$out/a.h5"
expect_exit 2 "--features: engine 'cpu-ref' takes no features" -- "$HARNESS" run --canary micro --features bf16 --out "$out/a.h5"
expect_exit 2 "--noise: not an option of engine cpu-ref; it belongs to --engine accel" -- "$HARNESS" run --canary micro --noise off --out "$out/a.h5"
# accel: each bad setting names its flag
A=("$HARNESS" run --canary micro --engine accel --out "$out/a.h5")
expect_exit 2 "unknown fp8 zone 'mlp'"      -- "${A[@]}" --features bf16,fp8=mlp
expect_exit 2 "unknown feature 'fp16'"      -- "${A[@]}" --features fp16
expect_exit 2 "fp8 needs bf16"              -- "${A[@]}" --features fp8=all
expect_exit 2 "--fp8-recipe: unknown recipe 'hybrid'" -- "${A[@]}" --features bf16,fp8=all --fp8-recipe hybrid
expect_exit 2 "--fp8-recipe: needs FP8 zones" -- "${A[@]}" --features bf16 --fp8-recipe current
expect_exit 2 "--amax-history: '0'"         -- "${A[@]}" --features bf16,fp8=all --amax-history 0
expect_exit 2 "--amax-history: '-3'"        -- "${A[@]}" --features bf16,fp8=all --amax-history -3
expect_exit 2 "--amax-algo: unknown"        -- "${A[@]}" --features bf16,fp8=all --amax-algo mean
expect_exit 2 "--margin: 'x'"               -- "${A[@]}" --features bf16,fp8=all --margin x
expect_exit 2 "--fp8-accumulate: 'partial'" -- "${A[@]}" --features bf16,fp8=all --fp8-accumulate partial
expect_exit 2 "--fp8-accumulate: '0'"       -- "${A[@]}" --features bf16,fp8=all --fp8-accumulate limited:0
expect_exit 2 "--noise: unknown mode 'loud'" -- "${A[@]}" --noise loud
expect_exit 2 "--noise-seed: '12ab'"        -- "${A[@]}" --noise-seed 12ab
expect_exit 2 "--noise-seed: '-1'"          -- "${A[@]}" --noise-seed -1
expect_exit 2 "--noise-seed: '9223372036854775808'" -- "${A[@]}" --noise-seed 9223372036854775808
expect_exit 2 "--noise-seed: only --noise seeded" -- "${A[@]}" --noise off --noise-seed 5
expect_exit 2 "--precision: not an option of engine accel; it belongs to --engine tpu-mesh" -- "${A[@]}" --precision bf16
# tpu-mesh: malformed meshes, unknown plans, plans that do not divide the model (the gate
# runs before any file is written), and flags of other engines
M=("$HARNESS" run --canary tiny --engine tpu-mesh --out "$out/a.h5")
expect_exit 2 "--mesh: '2y2' is not DxM"    -- "${M[@]}" --mesh 2y2
expect_exit 2 "--mesh: '0x2' is not DxM"    -- "${M[@]}" --mesh 0x2
expect_exit 2 "--mesh: '2x' is not DxM"     -- "${M[@]}" --mesh 2x
expect_exit 2 "--mesh: '2x2x2' is not DxM"  -- "${M[@]}" --mesh 2x2x2
expect_exit 2 "--shard-plan: unknown plan 'fsdp'" -- "${M[@]}" --shard-plan fsdp
expect_exit 2 "--precision: unknown precision 'fp16'" -- "${M[@]}" --precision fp16
expect_exit 2 "inputs dimension 0 has size 8, which does not divide into 3 shards" -- "${M[@]}" --mesh 3x1
expect_exit 2 "--shard-plan tp on --mesh 1x3" -- "${M[@]}" --mesh 1x3 --shard-plan tp
expect_exit 2 "--shard-plan zero3 on --mesh 16x1" -- "${M[@]}" --mesh 16x1 --shard-plan zero3
expect_exit 2 "--features: engine tpu-mesh takes no features" -- "${M[@]}" --features bf16
expect_exit 2 "--compile-mode: unknown mode 'eager'" -- "${M[@]}" --compile-mode eager
expect_exit 2 "--grad-accum: 'x' is not a count of micro-batches" -- "${M[@]}" --grad-accum x
expect_exit 2 "--grad-accum: '0' is not a count of micro-batches" -- "${M[@]}" --compile-mode microstep --grad-accum 0
expect_exit 2 "--grad-accum 3: the batch of 8 sequences does not split into 2 data shards x 3 micro-batches" -- \
  "${M[@]}" --mesh 2x1 --compile-mode microstep --grad-accum 3
expect_exit 2 "--noise: not an option of engine tpu-mesh" -- "${M[@]}" --noise off
expect_exit 2 "--mesh: not an option of engine cpu-ref; it belongs to --engine tpu-mesh" -- \
  "$HARNESS" run --canary micro --mesh 2x1 --out "$out/a.h5"
# audit: an engine that compiles its steps (tpu-mesh); one that runs each op as it is called
# is refused, naming those that compile. The engine flags are checked like run's.
expect_exit 2 "^harness: error: --engine: cpu-ref runs each op as it is called and compiles no graph to audit; choose an engine that compiles its steps \(tpu-mesh\)$" -- \
  "$HARNESS" audit --canary micro --engine cpu-ref
expect_exit 2 "--engine: accel runs each op as it is called" -- "$HARNESS" audit --canary micro --engine accel --noise off
expect_exit 2 "--mesh: not an option of engine accel; it belongs to --engine tpu-mesh" -- \
  "$HARNESS" audit --canary micro --engine accel --mesh 2x1
expect_exit 2 "--shard-plan: unknown plan 'x'" -- "$HARNESS" audit --canary micro --engine tpu-mesh --shard-plan x
[ -z "$(ls -A "$out")" ] || fail "rejected runs left files: $(ls "$out")"

# An existing receipt is never overwritten without --force, and stays byte-identical.
expect_exit 0 "" -- "$HARNESS" run --canary micro --steps 2 --out "$out/keep.h5"
before=$(sha256sum "$out/keep.h5")
expect_exit 2 "exists; pass --force" -- "$HARNESS" run --canary micro --steps 2 --out "$out/keep.h5"
[ "$before" = "$(sha256sum "$out/keep.h5")" ] || fail "refused run changed the existing receipt"
expect_exit 0 "" -- "$HARNESS" run --canary micro --steps 3 --out "$out/keep.h5" --force
"$HARNESS" inspect --json "$out/keep.h5" | grep -q '"steps_recorded": 3' || fail "--force did not rewrite the receipt"

# inspect: every bad file is exit 2 with the file named.
echo "plain text" > "$WORK/text.h5"
expect_exit 2 "text.h5: not an HDF5 file" -- "$HARNESS" inspect "$WORK/text.h5"
expect_exit 2 "missing.h5: no such file"  -- "$HARNESS" inspect "$WORK/missing.h5"
head -c 3000 "$out/keep.h5" > "$WORK/truncated.h5"
expect_exit 2 "truncated.h5: "            -- "$HARNESS" inspect "$WORK/truncated.h5"
# copy_with_manifest_attr SRC DST NAME VALUE: a copy of SRC whose /manifest NAME is VALUE (int64).
copy_with_manifest_attr() {
  cp "$1" "$2"
  $PY -c 'import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f["manifest"].attrs[sys.argv[2]] = np.int64(sys.argv[3])' "$2" "$3" "$4"
}
copy_with_manifest_attr "$out/keep.h5" "$WORK/future.h5" schema_version 7
expect_exit 2 "future.h5: schema 7\.[0-9]+ was written by a newer harness" -- "$HARNESS" inspect "$WORK/future.h5"
copy_with_manifest_attr "$out/keep.h5" "$WORK/newer_minor.h5" schema_minor 9
expect_exit 0 ""                          -- "$HARNESS" inspect "$WORK/newer_minor.h5"
copy_with_manifest_attr "$out/keep.h5" "$WORK/incomplete.h5" complete 0
expect_exit 2 "incomplete receipt"        -- "$HARNESS" inspect "$WORK/incomplete.h5"
expect_exit 0 ""                          -- "$HARNESS" inspect --allow-incomplete "$WORK/incomplete.h5"
expect_exit 2 "--bogus"                   -- "$HARNESS" inspect --bogus "$out/keep.h5"
expect_exit 2 ""                          -- "$HARNESS"

# The CLI at first glance: a typo is named, with the nearest valid name.
expect_exit 2 "needs a subcommand: one of run, inspect" -- "$HARNESS"
expect_exit 2 "unknown subcommand 'rnu' of .harness.; did you mean 'run'\?" -- "$HARNESS" rnu
expect_exit 2 "unknown flag '--ouput' of .harness run.; did you mean '--out'\?" -- "$HARNESS" run --canary micro --ouput "$out/a.h5"
expect_exit 2 "unknown subcommand 'stats' of .harness golden.; did you mean 'status'\?" -- "$HARNESS" golden stats
expect_exit 2 "unknown flag '--jsn' of .harness inspect.; did you mean '--json'\?" -- "$HARNESS" inspect --jsn "$out/keep.h5"
expect_exit 2 "unknown subcommand 'frobnicate' of .harness. \(one of" -- "$HARNESS" frobnicate
expect_exit 0 ""                          -- "$HARNESS" --version
grep -qE '^harness [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-f]{40}(-dirty)?, .*receipt schema 1\.[0-9]+\)$' "$WORK/stdout" \
  || fail "--version does not say version, commit and schema: $(cat "$WORK/stdout")"
[ ! -e "$out/a.h5" ] || fail "a refused command left $out/a.h5 behind"

# inspect --json is valid JSON with the documented keys.
"$HARNESS" inspect --json "$out/keep.h5" | $PY -c '
import json, sys
j = json.load(sys.stdin)
for key in ["schema_version", "lane", "engine", "features", "steps_planned", "steps_recorded", "complete",
            "first_loss", "last_loss", "manifest", "datasets"]:
    assert key in j, key
assert j["lane"] == "micro/cpu-ref" and j["complete"] is True
' || fail "inspect --json keys"
# Strings that are not UTF-8: in a receipt they are a schema problem named by validate; in a
# file name they are printed as U+FFFD, and every --json output stays a JSON document.
run_dir="$WORK/utf8"; mkdir -p "$run_dir"
"$HARNESS" run --canary micro --steps 2 --out "$run_dir/good.h5" >/dev/null 2>&1 || fail "utf8: run"
cp "$run_dir/good.h5" "$run_dir/bad-cpu.h5"
"$PY" - "$run_dir/bad-cpu.h5" <<'PY' || fail "utf8: could not write a non-UTF-8 attribute"
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    value = b"\xff\xfeXeon"
    del f["manifest"].attrs["cpu"]
    f["manifest"].attrs.create("cpu", value, dtype=h5py.string_dtype("utf-8", len(value)))
PY
expect_exit 2 "bad-cpu.h5: /manifest/cpu: is not valid UTF-8" -- "$HARNESS" validate "$run_dir/bad-cpu.h5"
expect_exit 2 "bad-cpu.h5: /manifest/cpu: is not valid UTF-8" -- "$HARNESS" compare "$run_dir/bad-cpu.h5" "$run_dir/good.h5"
odd="$run_dir/$(printf 'odd-\xff.h5')"
cp "$run_dir/good.h5" "$odd"
for command in "validate --json" "inspect --json" "check --json --golden $run_dir/good.h5" \
               "compare --json $run_dir/good.h5" "bisect --json $run_dir/good.h5"; do
  # shellcheck disable=SC2086
  set -- $command
  "$HARNESS" "$1" "$odd" "${@:2}" >"$WORK/stdout" 2>"$WORK/stderr"
  [ $? -eq 0 ] || fail "$1 of a non-UTF-8 file name: $(cat "$WORK/stderr")"
  "$PY" -c 'import json, sys; json.load(open(sys.argv[1]))' "$WORK/stdout" || fail "$1 --json is not JSON"
done
# Inputs that are not receipts never wait: a FIFO is refused before HDF5 opens it, and
# --follow on a file or directory no run writes ends at once (a run locks its output first).
mkfifo "$run_dir/fifo.h5" && echo "text" > "$run_dir/text.h5" && mkdir "$run_dir/dir.h5"
expect_exit 2 "fifo.h5: is not a regular file, not a receipt" -- timeout 20 "$HARNESS" validate "$run_dir/fifo.h5"
expect_exit 2 "dir.h5: is a directory, not a receipt \(and no run writes it\)" -- \
  timeout 20 "$HARNESS" inspect --follow "$run_dir/dir.h5"
expect_exit 2 "text.h5: not an HDF5 file .*\(and no run writes it\)" -- timeout 20 "$HARNESS" inspect --follow "$run_dir/text.h5"
expect_exit 2 "--interval: nan is not a number of seconds" -- "$HARNESS" inspect --follow --interval nan "$run_dir/good.h5"
expect_exit 2 "--threads: Value -1 not in range 0 to 1024" -- "$HARNESS" replay "$run_dir/good.h5" --threads -1
expect_exit 2 "--from: Value  not in range" -- "$HARNESS" replay "$run_dir/good.h5" --from ''
expect_exit 2 "--threads: Value -1 not in range 0 to 1024" -- "$HARNESS" nightly --threads -1
# Every command that takes --threads takes the one range (harness/cli/thread_flag.h): the
# commands are read from --help, so a new one that writes its own range fails here.
threaded=0
for command in $("$HARNESS" --help | sed -n '/^Subcommands:/,$s/^  \([a-z]\+\) .*/\1/p'); do
  "$HARNESS" "$command" --help | grep -q -- "--threads" || continue
  threaded=$((threaded + 1))
  expect_exit 2 "--threads: Value 1025 not in range 0 to 1024" -- "$HARNESS" "$command" --threads 1025
done
[ "$threaded" -ge 8 ] || fail "only $threaded commands take --threads (run, replay, audit, nightly, calibrate, power, invariance, triage do)"
# A dataset whose shape declares far more than the file stores (a forged or damaged
# extent: chunked, nothing written) is named, never allocated: no std::bad_alloc.
cp "$run_dir/good.h5" "$run_dir/huge.h5"
"$PY" - "$run_dir/huge.h5" <<'PY' || fail "huge: could not write a forged extent"
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["steps/loss"]
    f.create_dataset("steps/loss", shape=(1 << 40,), maxshape=(None,), chunks=(16,), dtype="<f8")
PY
"$HARNESS" validate "$run_dir/huge.h5" >"$WORK/stdout" 2>"$WORK/stderr"
[ $? -eq 2 ] || fail "validate of a forged extent: not exit 2"
grep -qE "huge.h5: /steps/loss: unreadable \(/steps/loss declares 1099511627776 elements .* the dataset is damaged\)" \
  "$WORK/stdout" "$WORK/stderr" || fail "validate of a forged extent: $(cat "$WORK/stdout" "$WORK/stderr")"
for command in "check --golden $run_dir/good.h5" "compare $run_dir/good.h5" "replay" "inspect"; do
  # shellcheck disable=SC2086
  set -- $command
  expect_exit 2 "huge.h5: /steps/" -- "$HARNESS" "$1" "$run_dir/huge.h5" "${@:2}"
  grep -q "bad_alloc" "$WORK/stderr" && fail "$1 of a forged extent: $(cat "$WORK/stderr")"
done
# A manifest attribute is one value: an array or an empty dataspace is named (it was read
# past its one value's buffer, or as 0), by validate and by every judging command.
cp "$run_dir/good.h5" "$run_dir/array.h5" && cp "$run_dir/good.h5" "$run_dir/empty-attr.h5"
"$PY" - "$run_dir/array.h5" "$run_dir/empty-attr.h5" <<'PY' || fail "could not write odd attributes"
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["manifest"].attrs["complete"]
    f["manifest"].attrs["complete"] = np.array([1, 1], dtype=np.int64)
with h5py.File(sys.argv[2], "r+") as f:
    del f["manifest"].attrs["seed"]
    f["manifest"].attrs["seed"] = h5py.Empty("<i8")
PY
expect_exit 2 "array.h5: /manifest/complete: is an array of 2 values, where one value belongs" -- \
  "$HARNESS" check "$run_dir/array.h5" --golden "$run_dir/good.h5"
expect_exit 2 "empty-attr.h5: /manifest/seed: holds no value \(an empty dataspace\)" -- \
  "$HARNESS" compare "$run_dir/good.h5" "$run_dir/empty-attr.h5"
"$HARNESS" validate "$run_dir/array.h5" >"$WORK/stdout" 2>&1 && fail "validate passed an array-valued attribute"
# A receipt holds its data itself: a soft or external link (whose target the golden's
# content hash does not cover) is named.
cp "$run_dir/good.h5" "$run_dir/linked.h5"
"$PY" - "$run_dir/linked.h5" "$run_dir/good.h5" <<'PY' || fail "could not write links"
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["manifest"]
    f["manifest"] = h5py.ExternalLink(sys.argv[2], "/manifest")
PY
expect_exit 2 "linked.h5: /manifest: is an external link \(to another file\), where a receipt holds its data itself" -- \
  "$HARNESS" check "$run_dir/linked.h5" --golden "$run_dir/good.h5"
# Past a file size limit a run and an export end in one line, exit 2, and leave no file.
mkdir "$run_dir/limited"
expect_exit 2 "limited/r.h5: HDF5 cannot flush the receipt \(File too large\); the damaged file is removed" -- \
  bash -c "ulimit -f 50; exec \"\$0\" run --canary micro --steps 3 --out '$run_dir/limited/r.h5'" "$HARNESS"
expect_exit 2 "limited/p.h5.partial: cannot write the pack \(File too large\); nothing was written" -- \
  bash -c "ulimit -f 50; exec \"\$0\" export --canary micro --out '$run_dir/limited/p.h5'" "$HARNESS"
[ -z "$(ls -A "$run_dir/limited")" ] || fail "a run or export past the file size limit left $(ls "$run_dir/limited")"
# A seed past int64 is a flag error, not clamped to 2**63-1 (run, export, audit)
for command in "run --out $run_dir/seeded.h5" "export --out $run_dir/seeded.h5" audit; do
  # shellcheck disable=SC2086
  expect_exit 2 "--seed: '99999999999999999999' is not a seed: want an integer between 0 and 9223372036854775807" -- \
    "$HARNESS" $command --canary micro --seed 99999999999999999999
done
[ ! -e "$run_dir/seeded.h5" ] || fail "a refused --seed left a file"
# Sizes within a canary file's ranges that need more memory than any machine has are named
# before anything is allocated (they ended in std::bad_alloc, naming nothing)
sed 's/^channels = 32/channels = 65536/' "$HERE/../../canaries/micro.toml" > "$run_dir/wide.toml"
grep -q "^channels = 65536" "$run_dir/wide.toml" || fail "micro.toml no longer has channels = 32"
for command in "run --steps 2 --out $run_dir/wide.h5" "export --steps 2 --out $run_dir/wide.h5" audit; do
  # shellcheck disable=SC2086
  expect_exit 2 "canary 'micro' needs at least [0-9.]+ GB for its tensors \(model.context 16, model.channels 65536, .*\), more than this machine's" -- \
    "$HARNESS" $command --canary "$run_dir/wide.toml"
done
[ ! -e "$run_dir/wide.h5" ] || fail "a canary too large for memory left a file"
# Numbers and names no writer records: a negative seed or thread count, an empty lane
cp "$run_dir/good.h5" "$run_dir/negative.h5"
"$PY" - "$run_dir/negative.h5" <<'PY' || fail "could not write negative attributes"
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    f["manifest"].attrs["seed"] = np.int64(-1)
    f["manifest"].attrs["threads"] = np.int64(-2)
    f["manifest"].attrs.create("lane", b"", dtype=h5py.string_dtype("utf-8", 1))
PY
"$HARNESS" validate "$run_dir/negative.h5" >"$WORK/stdout" 2>&1 && fail "validate passed a negative seed"
for problem in "/manifest/seed: -1 is negative" "/manifest/threads: -2 is negative" "/manifest/lane: is empty"; do
  grep -qF "negative.h5: $problem" "$WORK/stdout" || fail "validate does not say '$problem': $(cat "$WORK/stdout")"
done
# /trace's contents, as bisect reads them: the level, op indices in order, known phases
"$HARNESS" run --canary micro --steps 2 --trace ops --out "$run_dir/traced.h5" >/dev/null 2>&1 || fail "traced run"
"$HARNESS" validate "$run_dir/traced.h5" >/dev/null 2>&1 || fail "a traced receipt does not validate"
cp "$run_dir/traced.h5" "$run_dir/bad-trace.h5"
"$PY" - "$run_dir/bad-trace.h5" <<'PY' || fail "could not change /trace"
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    f["trace/op_index"][0] = 5
    phase = f["trace/phase"][()]
    phase[1] = b"zz"
    f["trace/phase"][...] = phase
    f["trace"].attrs.create("level", b"all", dtype=h5py.string_dtype("utf-8", 3))
PY
"$HARNESS" validate "$run_dir/bad-trace.h5" >"$WORK/stdout" 2>&1 && fail "validate passed a damaged /trace"
for problem in "/trace/op_index: \[0\] is 5: op indices count the ops from 0" "/trace/phase: \[1\] is 'zz', not one of" \
               '/trace: attribute level must be the string "ops"'; do
  grep -qE "bad-trace.h5: $problem" "$WORK/stdout" || fail "validate does not say '$problem': $(cat "$WORK/stdout")"
done
finish
