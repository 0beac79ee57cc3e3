#!/usr/bin/env bash
# calibrate --hosts (docs/budgets.md, "Hosts"): a lane's repeats run on emulated hosts; each
# run's receipt records the kernels the variant chose, so the variant is seen to reach the
# run; the harness's engines are bitwise across their kernel variants (every host's
# deviation the same); an entry calibrated on some hosts holds on the held-out ones and
# names the hosts and the real CPU; PyTorch's ATen ISA moves a torch lane's bits; bad input
# exits 2 with one line before anything runs.
source "$(dirname "$0")/lib.sh"
MATRIX="$HERE/data/micro_nightly.toml"
BUDGETS="$HERE/../../canaries/budgets.toml"
"$PY" -c "import torch" 2>/dev/null || { echo "FAIL: $PY has no torch (the torch lane needs it)" >&2; exit 1; }
calibrate() { "$HARNESS" calibrate --budgets "$BUDGETS" --provisional "$@"; }

# tp (tpu-mesh, deterministic) on four kernel hosts, the last held out
HOSTS="gemm-avx2,gemm-generic,elementwise-sse,HARNESS_GEMM_KERNEL=generic+HARNESS_ELEMENTWISE_KERNEL=sse-4"
expect_exit 0 "" -- calibrate --lane tp --hosts "$HOSTS" --held-out 1 --matrix "$MATRIX" --out "$WORK/tp.toml"
for want in "on gemm-avx2 \(kernels gemm=avx2-fma " "on gemm-generic \(kernels gemm=generic " \
            "on elementwise-sse \(kernels gemm=[a-z0-9-]+ elementwise=sse-4\)" \
            "on HARNESS_GEMM_KERNEL=generic\+HARNESS_ELEMENTWISE_KERNEL=sse-4 \(kernels gemm=generic elementwise=sse-4\) \(held out\)"; do
  grep -qE -- "^- repeat 0 $want" "$WORK/tp.md" || fail "no run on the host /$want/: $(grep '^- repeat' "$WORK/tp.md")"
done
[ "$(grep '^- repeat' "$WORK/tp.md" | sed 's/^.*: now //' | sort -u | wc -l)" -eq 1 ] ||
  fail "tp's deviation differs across kernel hosts: $(grep '^- repeat' "$WORK/tp.md")"
grep -q "^false alarm 0 of 1 held-out samples outside the proposal" "$WORK/stdout" || fail "the held-out host is outside"
"$PY" - "$WORK/tp.toml" <<'PY' || fail "the entry does not name its hosts"
import sys, tomllib
entry = tomllib.load(open(sys.argv[1], "rb"))["mesh-fp32"]
assert entry["host_variants"] == sys.argv[0:0] + ["gemm-avx2", "gemm-generic", "elementwise-sse",
                                                   "HARNESS_GEMM_KERNEL=generic+HARNESS_ELEMENTWISE_KERNEL=sse-4"], entry
assert len(entry["host_cpus"]) == 1 and entry["host_cpus"][0], entry
assert entry["samples"] == 3 and entry["held_out"] == 1 and entry["held_out_outside"] == 0, entry
assert "on 4 emulated hosts" in entry["method"], entry["method"]
PY
# a seeded lane: every run its own noise seed, on every host (2 x 2)
expect_exit 0 "" -- calibrate --lane bf16 --hosts gemm-avx2,gemm-generic --repeats 2 --matrix "$MATRIX" --out "$WORK/bf16.toml"
for seed in 1000 1001 1002 1003; do
  grep -q "(noise seed $seed) on gemm-" "$WORK/bf16.md" || fail "no run of noise seed $seed: $(grep '^- repeat' "$WORK/bf16.md")"
done

# A torch lane (Debian's torch): ATen's ISA is a host, and it moves the lane's bits
printf '%s\n' 'schema_version = 1' 'canary = "micro"' 'steps = 12' 'seed = 7' 'reference = "ref"' '[[lanes]]' 'id = "ref"' \
  'engine = "cpu-ref"' '[[lanes]]' 'id = "torch"' 'engine = "torch"' 'device = "cpu"' 'precision = "bf16"' >"$WORK/torch.toml"
expect_exit 0 "" -- calibrate --lane torch --hosts aten-default,aten-avx2 --matrix "$WORK/torch.toml" --out "$WORK/torch-hosts.toml"
[ "$(grep '^- repeat' "$WORK/torch-hosts.md" | sed 's/^.*: now //' | sort -u | wc -l)" -eq 2 ] ||
  fail "ATen's default kernels did not move the torch lane: $(grep '^- repeat' "$WORK/torch-hosts.md")"

# bad input: one line, exit 2, no candidate
for bad in "--lane tp --hosts aten-avx3:--hosts: 'aten-avx3' is neither a preset \(gemm-generic, " \
           "--lane tp --hosts gemm-avx2,gemm-avx2:--hosts: gemm-avx2 is given twice" \
           "--lane tp --hosts A=1+A=2:--hosts: 'A=1\+A=2' sets A twice" \
           "--lane tp --hosts 1X=2:--hosts: '1X=2' is neither a preset" \
           "--lane bf16 --hosts gemm-avx2 --perturb 2:--hosts: runs the lane's repeats on each host; give --repeats" \
           "--lane tp --hosts gemm-avx2,gemm-generic --held-out 2:--held-out 2: --repeats 1 on 2 hosts gives 2 samples"; do
  # shellcheck disable=SC2086
  expect_exit 2 "^harness: error: ${bad#*:}" -- calibrate ${bad%%:*} --matrix "$MATRIX" --out "$WORK/bad.toml"
  [ ! -e "$WORK/bad.toml" ] || fail "a refused calibration ($bad) wrote a candidate"
done
finish
