# Shared by the bench scripts: they measure the harness that is already built and write
# their results outside the checkout, unless asked otherwise.
#   HARNESS_BIN=PATH         the harness to measure (default build/bin/harness)
#   HARNESS_BENCH_BUILD=1    build it (and the benchmarks) first, with scripts/build.sh
#   first argument OUT_DIR   where results go (default a new directory under ${TMPDIR:-/tmp})
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# bench_out NAME [OUT_DIR]: prints the results directory, made.
bench_out() {
  local dir=${2:-${TMPDIR:-/tmp}/harness-$1-$(date -u +%Y%m%dT%H%M%SZ)}
  mkdir -p "$dir" && echo "$dir"
}

# bench_harness [cmake args...]: prints the harness binary; builds only when asked.
bench_harness() {
  if [ "${HARNESS_BENCH_BUILD:-0}" = 1 ]; then "$root/scripts/build.sh" "$@" >/dev/null; fi
  local bin=${HARNESS_BIN:-$root/build/bin/harness}
  if [ ! -x "$bin" ]; then
    echo "bench: no harness at $bin: build it (scripts/build.sh), set HARNESS_BIN, or rerun with HARNESS_BENCH_BUILD=1" >&2
    exit 2
  fi
  echo "$bin"
}
