#!/usr/bin/env bash
# The held-out evaluation (docs/logit-kl.md): the page run as written; the bitwise
# comparison's logit metrics exact, the bf16 lane's judged under its entries and inside
# them; a bad [eval] key is one line naming it, exit 2.
source "$(dirname "$0")/lib.sh"
run_page logit-kl.md
for metric in logit_kl logprob_delta top1_mismatch; do
  grep -qE "^PASS  $metric +exact" "$WORK/page.out" || fail "cpu-ref at 1 and 2 threads: $metric is not exact"
done
"$PY" - "$WORK/kl-bf16.json" <<'PY' || fail "the bf16 lane's logit metrics are not judged and inside their budget"
import json, sys
v = json.load(open(sys.argv[1]))
assert v["verdict"] == "pass" and v["logits_not_compared"] is None, v
metrics = {m["metric"]: m for m in v["metrics"]}
for name in ("logit_kl", "logprob_delta", "top1_mismatch"):
    m = metrics[name]
    assert m["judged"] and m["pass"] and 0 < m["max_deviation"] < m["allowed"], m
    assert len(m["step_deviation"]) == 101 and m["step_deviation"][100] > 0, m  # the final parameters' evaluation
PY
sed '/^\[eval\]/,$d' "$HERE/../../canaries/micro.toml" > "$WORK/rows.toml"
printf '[eval]\nevery = 5\nrows = 9\n' >> "$WORK/rows.toml"
expect_exit 2 "rows.toml: eval.rows: " -- "$HARNESS" run --canary "$WORK/rows.toml" --out "$WORK/rows.h5"
[ ! -e "$WORK/rows.h5" ] || fail "a refused canary file left a receipt"
finish
