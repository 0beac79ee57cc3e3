#!/usr/bin/env bash
# calibrate --hosts (docs/budgets.md, "Hosts"): a lane's repeats run on emulated hosts; each
# run's receipt records the kernels the variant chose, so the variant is seen to reach the
# run; the harness's engines are bitwise across their kernel variants (every host's
# deviation the same); an entry calibrated on some hosts holds on the held-out ones and
# names the hosts and the real CPU; PyTorch's ATen ISA and its BLAS's kernels move a torch
# lane's bits; bad input exits 2 with one line before anything runs.
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
# where the CPU lacks AVX512_BF16. Where it has it, oneDNN's native bf16 kernels do the bf16
# lane's work whatever ATen's ISA, and no knob lowers them (ONEDNN_MAX_CPU_ISA below
# AVX512_CORE makes torch 1.13's bf16 primitives fail): the two hosts give one deviation
# (docs/budgets.md, "Hosts: --hosts").
expect_exit 0 "" -- calibrate --lane torch --hosts aten-default,aten-avx2 --matrix "$WORK/torch.toml" --out "$WORK/torch-hosts.toml"
deviations=$(grep '^- repeat' "$WORK/torch-hosts.md" | sed 's/^.*: now //' | sort -u | wc -l)
if grep -qw avx512_bf16 /proc/cpuinfo; then
  [ "$deviations" -eq 1 ] || fail "ATen's ISA moved the bf16 lane on an AVX512_BF16 host: $(grep '^- repeat' "$WORK/torch-hosts.md")"
else
  [ "$deviations" -eq 2 ] || fail "ATen's default kernels did not move the torch lane: $(grep '^- repeat' "$WORK/torch-hosts.md")"
fi
# Debian's torch does its fp32 GEMMs in OpenBLAS: its SSE3 kernels move the fp32 lane's bits
sed -i 's/precision = "bf16"/precision = "fp32"/' "$WORK/torch.toml"
expect_exit 0 "" -- calibrate --lane torch --hosts openblas-prescott,openblas-haswell --matrix "$WORK/torch.toml" \
  --out "$WORK/torch-blas.toml"
[ "$(grep '^- repeat' "$WORK/torch-blas.md" | sed 's/^.*: now //' | sort -u | wc -l)" -eq 2 ] ||
  fail "OpenBLAS's SSE3 kernels did not move the fp32 torch lane: $(grep '^- repeat' "$WORK/torch-blas.md")"

# A layout entry from pairs (scripts/calibrate-layout.sh): ddp against one process of the same
# initialisation on the same host, 3 initialisations (the canary's own and seeds 1, 2) x 2 hosts;
# the last host's pairs held out, every receipt judged against its own pair.
LAYOUT="$HERE/../../scripts/calibrate-layout.sh"
export HARNESS  # the script runs this harness
expect_exit 0 "" -- "$LAYOUT" --canary micro --layouts ddp --python "$PY" --hosts aten-avx2,openblas-prescott \
  --seeds 2 --provisional --budgets "$BUDGETS" --out "$WORK/layout"
grep -q "^6 receipts of micro/torch+ddp against micro/torch (6 pairs," "$WORK/layout/ddp.candidate.md" ||
  fail "the layout calibration is not made of 6 pairs: $(head -3 "$WORK/layout/ddp.candidate.md")"
for host in aten-avx2 openblas-prescott; do
  for init in own seed1 seed2; do
    tag="$host-torch[0-9a-z.]*-$init"
    grep -qE "^- \S*/ddp-$tag.h5 \(against \S*/one-$tag.h5\)" "$WORK/layout/ddp.candidate.md" ||
      fail "no pair of $host, $init: $(grep '^- ' "$WORK/layout/ddp.candidate.md")"
  done
done
[ "$(grep -c '(held out)' "$WORK/layout/ddp.candidate.md")" -eq 3 ] &&
  ! grep '(held out)' "$WORK/layout/ddp.candidate.md" | grep -q aten-avx2 || fail "the held-out pairs are not the last host's"
# The entry names the emulated hosts its pairs ran under, read from each receipt's numerics env
# (a knob the machine's own environment sets, as OPENBLAS_CORETYPE on some runners, is part of
# the first host; the second host's openblas-prescott overrides it)
"$PY" - "$WORK/layout/ddp.candidate.toml" <<'PY' || fail "the pairs' entry does not name their hosts"
import sys, tomllib
entry = tomllib.load(open(sys.argv[1], "rb"))["torch-ddp"]
first, second = entry["host_variants"]
assert first == "aten-avx2" or "ATEN_CPU_CAPABILITY=avx2" in first.split("+"), entry["host_variants"]
assert second == "openblas-prescott", entry["host_variants"]
assert f"on 2 emulated hosts ({first}, {second})" in entry["method"], entry["method"]
PY
# Pairs of one host name none: a knob they all share is the machine's own environment
mapfile -t one_host < <(ls "$WORK"/layout/ddp-aten-avx2-*.h5)
references=()
for receipt in "${one_host[@]}"; do references+=("${receipt/\/ddp-//one-}"); done
expect_exit 0 "" -- calibrate --receipts "${one_host[@]}" --reference "${references[@]}" --out "$WORK/one-host.toml"
"$PY" - "$WORK/one-host.toml" <<'PY' || fail "pairs of one host name a host"
import sys, tomllib
entry = tomllib.load(open(sys.argv[1], "rb"))["torch-ddp"]
assert "host_variants" not in entry and "emulated host" not in entry["method"], entry
assert entry["samples"] == 3 and entry["host_cpus"], entry
PY
# The stack's own entries from the same kind of pairs: cpu, the one-process lane against
# cpu-ref of its seed; host, the lane on the second host against the lane on the first
expect_exit 0 "" -- "$LAYOUT" --canary micro --layouts cpu,host --python "$PY" --hosts aten-avx2,openblas-prescott \
  --seeds 2 --held-out-hosts 0 --provisional --budgets "$BUDGETS" --out "$WORK/layout"
grep -q "^6 receipts of micro/torch against micro/cpu-ref (6 pairs," "$WORK/layout/cpu.candidate.md" ||
  fail "the cpu calibration is not made of 6 pairs: $(head -3 "$WORK/layout/cpu.candidate.md")"
for init in own seed1 seed2; do
  grep -qE "^- \S*/one-openblas-prescott-torch[0-9a-z.]*-$init.h5 \(against \S*/cpu-ref-$init.h5\)" \
    "$WORK/layout/cpu.candidate.md" || fail "no cpu pair of $init: $(grep '^- ' "$WORK/layout/cpu.candidate.md")"
  grep -qE "^- \S*/one-openblas-prescott-(torch[0-9a-z.]*)-$init.h5 \(against \S*/one-aten-avx2-\1-$init.h5\)" \
    "$WORK/layout/host.candidate.md" || fail "no host pair of $init: $(grep '^- ' "$WORK/layout/host.candidate.md")"
done
# The canary's own weights are among the pairs: its pack is the one `harness export` makes
# without --seed, and its cpu-ref run the canary's own
"$PY" - "$WORK/layout" <<'PY' || fail "the own initialisation is not the canary's own"
import sys, h5py
d = sys.argv[1]
with h5py.File(f"{d}/cpu-ref-own.h5", "r") as own, h5py.File(f"{d}/cpu-ref-seed1.h5", "r") as seed1:
    seeds = own["manifest"].attrs["seed"], seed1["manifest"].attrs["seed"]
    assert seeds[0] != seeds[1] == 1, seeds
PY
grep -q "^\[torch-host\]" "$WORK/layout/host.candidate.toml" && grep -q "^\[torch-cpu\]" "$WORK/layout/host.candidate.toml" ||
  fail "the host candidate does not carry both entries"
# bf16 autocast's entries from the same packs: bf16, the bf16 lane against cpu-ref of its seed;
# host-bf16, the bf16 lane on the second host against it on the first (the fp32 runs are reused)
expect_exit 0 "" -- "$LAYOUT" --canary micro --layouts bf16,host-bf16 --python "$PY" --hosts aten-avx2,openblas-prescott \
  --seeds 2 --held-out-hosts 0 --provisional --budgets "$BUDGETS" --out "$WORK/layout"
grep -q "^6 receipts of micro/torch+bf16 against micro/cpu-ref (6 pairs," "$WORK/layout/bf16.candidate.md" ||
  fail "the bf16 calibration is not made of 6 pairs: $(head -3 "$WORK/layout/bf16.candidate.md")"
for init in own seed1 seed2; do
  grep -qE "^- \S*/bf16-openblas-prescott-(torch[0-9a-z.]*)-$init.h5 \(against \S*/bf16-aten-avx2-\1-$init.h5\)" \
    "$WORK/layout/host-bf16.candidate.md" || fail "no host-bf16 pair of $init: $(grep '^- ' "$WORK/layout/host-bf16.candidate.md")"
done
grep -q "^\[torch-host-bf16\]" "$WORK/layout/host-bf16.candidate.toml" && grep -q "^\[torch-bf16\]" "$WORK/layout/host-bf16.candidate.toml" ||
  fail "the host-bf16 candidate does not carry both entries"
expect_exit 2 "calibrate-layout.sh: --layouts: host pairs each host with the first; give two or more --hosts" -- \
  "$LAYOUT" --layouts host --python "$PY" --out "$WORK/bad-layout"
expect_exit 2 "calibrate-layout.sh: --layouts: host-bf16 pairs each host with the first; give two or more --hosts" -- \
  "$LAYOUT" --layouts bf16,host-bf16 --python "$PY" --out "$WORK/bad-layout"
expect_exit 2 "calibrate-layout.sh: --layouts: ddp, fsdp, compile, cpu, bf16, xla, jax, jax-bf16, host, .* not 'pp'" -- \
  "$LAYOUT" --layouts pp --python "$PY" --out "$WORK/bad-layout"
# a kind that no interpreter has what it needs for (Debian's torch 1.13: no torch.compile,
# torch_xla or JAX): refused before any run
if ! "$PY" -c 'import torch; assert hasattr(torch, "compile")' 2>/dev/null; then
  expect_exit 2 "calibrate-layout.sh: --layouts compile: no --python interpreter has what it needs" -- \
    "$LAYOUT" --layouts compile --python "$PY" --out "$WORK/bad-layout"
fi
if ! "$PY" -c 'import jax' 2>/dev/null; then
  expect_exit 2 "calibrate-layout.sh: --layouts jax: no --python interpreter has what it needs" -- \
    "$LAYOUT" --layouts jax --python "$PY" --out "$WORK/bad-layout"
fi
[ ! -e "$WORK/bad-layout" ] || fail "a refused calibrate-layout.sh made its --out directory"

# JAX's pairs (.venv/'s JAX): jax against cpu-ref on each host, jax-host the second host
# against the first; xla-sse42 caps XLA's CPU code below this CPU's AVX2, and moves the bits.
VENV_PY="$HERE/../../.venv/bin/python"
if [ -x "$VENV_PY" ]; then
  expect_exit 0 "" -- "$LAYOUT" --canary micro --layouts jax,jax-host --python "$VENV_PY" --hosts xla-avx2,xla-sse42 \
    --seeds 0 --held-out-hosts 0 --provisional --budgets "$BUDGETS" --out "$WORK/jax"
  grep -q "^2 receipts of micro/jax@1x1+dp against micro/cpu-ref (2 pairs," "$WORK/jax/jax.candidate.md" ||
    fail "the jax calibration is not made of 2 pairs: $(head -3 "$WORK/jax/jax.candidate.md")"
  grep -qE "/jax-xla-sse42-(torch[0-9a-z.]*)-own\.h5 \(?against \S*/jax-xla-avx2-\1-own\.h5" \
    "$WORK/jax/jax-host.candidate.md" || fail "no jax-host pair: $(head -3 "$WORK/jax/jax-host.candidate.md")"
  ! "$HARNESS" compare "$WORK"/jax/jax-xla-sse42-*-own.h5 "$WORK"/jax/jax-xla-avx2-*-own.h5 | grep -q "^PASS  loss .*exact" ||
    fail "xla-sse42 did not move JAX's bits on micro"
elif [ -n "${CI:-}" ]; then
  fail "no .venv/ (scripts/python-env.sh): JAX's pairs were not tested"
fi
expect_exit 2 "^harness: error: --hosts: 'aten-avx3' is neither a preset" -- "$LAYOUT" --python "$PY" \
  --hosts aten-avx3 --out "$WORK/bad-layout"

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
