#!/usr/bin/env bash
# The nightly HTML report in a real browser (headless Chromium): no console message at
# all (errors, uncaught exceptions), its script ran, every lane has a row, the charts,
# ticks, labels, legends, widths and commands a person reads (below), and a screenshot is
# saved for people to look at. Broken pages prove the checks bite.
source "$(dirname "$0")/lib.sh"
SHOT=${2:?usage: $0 path/to/harness screenshot.png}
unset CI
# micro_nightly.toml's lanes on micro evaluating its held-out batch every 4 steps
# (docs/logit-kl.md): the report charts the logit metrics at the evaluations.
{ cat "$HERE/../../canaries/micro.toml"; printf '\n[eval]\nevery = 4\n'; } > "$WORK/micro-eval.toml"
# and its bf16 lane tested for one-sided drift over 8 noise seeds (docs/nightly.md)
sed -e 's|^canary = "micro"|canary = "micro-eval.toml"|' -e '0,/^noise-seed = 11$/s//noise-seed = 11\nbias-repeats = 8/' \
  "$HERE/data/micro_nightly.toml" > "$WORK/nightly.toml"
grep -q '^bias-repeats = 8' "$WORK/nightly.toml" || fail "the matrix tests no lane for one-sided drift"
MATRIX="$WORK/nightly.toml"
cmp -s "$MATRIX" "$HERE/data/micro_nightly.toml" && fail "the matrix does not name the evaluating canary"

# chromium FILE ARGS...: dump the DOM of FILE to $WORK/dom, the browser's log to $WORK/log
chromium_open() {
  local page=$1; shift
  timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$WORK/profile" \
    --enable-logging=stderr --v=0 "$@" "file://$page" >"$WORK/dom" 2>"$WORK/log"
}
console_lines() { grep -E ':CONSOLE[:(]' "$WORK/log"; }

# the detector must see a broken page's errors, or its silence below means nothing
printf '<!DOCTYPE html><html><body><script>console.error("boom"); missing_function();</script></body></html>' > "$WORK/broken.html"
chromium_open "$WORK/broken.html" --dump-dom || fail "chromium did not open a page: $(tail -3 "$WORK/log")"
console_lines | grep -q "Uncaught ReferenceError" || fail "the console check misses an uncaught error: $(cat "$WORK/log")"

"$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$WORK/goldens" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$WORK/goldens" --approved-by test --allow-dirty >/dev/null 2>&1 || fail "goldens"
# failing lanes too (a bf16 loss budget of 1e-9), so that the page shows a failure's details
set_windows "$HERE/../../canaries/budgets.toml" bf16 loss '[ { steps = "0-", atol = 1e-9 } ]' "$WORK/tight.toml"
cmp -s "$WORK/tight.toml" "$HERE/../../canaries/budgets.toml" && fail "the bf16 loss budget was not tightened"
"$HARNESS" nightly --matrix "$MATRIX" --goldens "$WORK/goldens" --budgets "$WORK/tight.toml" --out "$WORK/report" >/dev/null 2>&1
[ $? -eq 1 ] || fail "the nightly under a 1e-9 bf16 budget did not exit 1"
page="$WORK/report/report.html"

chromium_open "$page" --dump-dom || fail "chromium could not open the report: $(tail -3 "$WORK/log")"
[ -z "$(console_lines)" ] || fail "the report logs to the console: $(console_lines)"
grep -q '<body data-ready="yes">' "$WORK/dom" || fail "the report's script did not run to its end"
[ "$(grep -o '<tr data-status=' "$WORK/dom" | wc -l)" -eq 5 ] || fail "the verdict table does not have 5 lanes"
grep -q 'data-status="fail"' "$WORK/dom" || fail "the bf16 lanes are not shown failing"
[ "$(grep -o '<svg' "$WORK/dom" | wc -l)" -ge 9 ] || fail "the report lacks the per-lane charts"

# What a person reads, checked in the rendered page at a 1280 px wide viewport: per lane one
# divergence chart per judged metric, in the summary's tightest-first order; decade ticks
# on the log axes (10 with a superscript exponent, never "1e-5.4"); both axis labels; a
# legend swatch per plotted series; nothing wider than the viewport; and the reproduce,
# bisect and replay commands for the failing lane only. A script appended to a copy of the
# page writes what it found into the DOM (a console message would fail the check above).
expected=$("$PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
metrics = lambda l: l["series"].get("envelope", {}).get("metrics", [])
print(json.dumps({l["id"]: {"status": l["status"], "metrics": [m["metric"] for m in metrics(l)],
                            "evaluations": {m["metric"]: len(m["steps"]) for m in metrics(l) if "steps" in m}}
                  for l in s["lanes"]}))' "$WORK/report/summary.json") || fail "summary.json unreadable"
[ "$(printf '%s' "$expected" | grep -o '"params_sketch"' | wc -l)" -ge 3 ] || fail "the summary's envelopes lack params_sketch: $expected"
[ "$(printf '%s' "$expected" | grep -o '"logit_kl": 3' | wc -l)" -ge 3 ] ||
  fail "the envelopes lack logit_kl at 3 evaluations: $expected"
cat > "$WORK/checks.js" <<JS
(function () {
  var expected = $expected, problems = [], count = 0;
  function check(ok, what) { count++; if (!ok) problems.push(what); }
  var failing = 0;
  Object.keys(expected).forEach(function (id) {
    var lane = document.getElementById('lane-' + id), want = expected[id];
    if (!lane) { problems.push('no section for lane ' + id); return; }
    var figures = lane.querySelectorAll('figure[data-metric]');
    var got = Array.prototype.map.call(figures, function (f) { return f.dataset.metric; });
    check(got.join() === want.metrics.join(), id + ': divergence charts ' + got.join() + ', want ' + want.metrics.join());
    var last = -Infinity;
    figures.forEach(function (f) {
      var h = f.dataset.headroom === 'none' ? -Infinity : parseFloat(f.dataset.headroom);
      check(h >= last, id + ': ' + f.dataset.metric + ' is not in tightest-first order');
      last = h;
      check(f.classList.contains('exact') || f.querySelector('svg.chart.log'), id + ': ' + f.dataset.metric + ' has no log chart');
      var evaluations = want.evaluations[f.dataset.metric];  // a logit metric: a dot per evaluation and series
      if (evaluations && !f.classList.contains('exact')) {
        var dots = f.querySelectorAll('svg.chart circle.sample').length;
        var series = f.querySelectorAll('svg.chart polyline').length;
        check(series > 0 && dots === series * evaluations,
              id + ': ' + f.dataset.metric + ' has ' + dots + ' dots for ' + evaluations + ' evaluations of ' +
              series + ' series');
      }
    });
    var commands = lane.querySelector('.commands'), text = commands ? commands.textContent : '';
    if (want.status === 'fail') {
      failing++;
      ['harness run --canary', '--seed ', 'harness bisect ', 'harness replay ', ' --from '].forEach(function (w) {
        check(text.indexOf(w) >= 0, id + ': the failing lane lacks "' + w + '"');
      });
    } else {
      check(!commands, id + ': a ' + want.status + ' lane shows reproduce commands');
    }
  });
  check(failing > 0, 'no failing lane to check the commands on');
  var bias = document.querySelector('#verdicts tr a[href="#lane-bf16"]');
  bias = bias && bias.closest('tr').querySelector('div.warn');
  check(bias && bias.textContent.indexOf('bias warn: biased') === 0, 'the verdict table lacks the bf16 lane\'s bias line');
  var bf16 = document.querySelector('#lane-bf16 .commands');
  check(bf16 && bf16.textContent.indexOf('--noise-seed 11') >= 0, 'the bf16 lane command lacks its noise seed');
  var charts = document.querySelectorAll('svg.chart');
  check(charts.length >= 12, 'only ' + charts.length + ' charts');
  charts.forEach(function (svg, i) {
    var name = 'chart ' + i + ' (' + (svg.querySelector('title') || {}).textContent + ')';
    var x = svg.querySelector('text.axis-label.x'), y = svg.querySelector('text.axis-label.y');
    check(x && x.textContent === 'step', name + ': no x axis label "step"');
    check(y && y.textContent.trim().length > 0, name + ': no y axis label');
    var ticks = svg.querySelectorAll('text.tick.y');
    check(ticks.length >= 2, name + ': fewer than 2 y ticks');
    if (svg.classList.contains('log')) {
      ticks.forEach(function (t) {
        var sup = t.querySelector('tspan');
        var decade = t.textContent === '1' || (sup && /^\u2212?[0-9]+$/.test(sup.textContent) && t.firstChild.nodeValue === '10');
        check(decade, name + ': tick "' + t.textContent + '" is not a decade');
      });
    }
    var legend = svg.parentNode.querySelectorAll('ul.legend li svg.swatch line[stroke]');
    var lines = svg.querySelectorAll('polyline');
    check(lines.length > 0 && legend.length === lines.length, name + ': ' + legend.length + ' legend swatches for ' + lines.length + ' series');
  });
  check(document.documentElement.scrollWidth <= window.innerWidth,
        'the page is ' + document.documentElement.scrollWidth + ' px wide in a ' + window.innerWidth + ' px viewport');
  document.querySelectorAll('body *').forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.right > window.innerWidth + 0.5) problems.push(e.tagName + '.' + e.className + ' ends at ' + Math.round(r.right) + ' px');
  });
  var out = document.createElement('pre');
  out.id = 'report-checks';
  out.textContent = problems.length ? 'PROBLEMS ' + problems.slice(0, 20).join(' | ') : 'CHECKS-OK ' + count;
  document.body.appendChild(out);
})();
JS
sed 's|</body>|<script src="checks.js"></script></body>|' "$page" > "$WORK/report/checked.html"
cp "$WORK/checks.js" "$WORK/report/checks.js"
chromium_open "$WORK/report/checked.html" --window-size=1280,2000 --dump-dom || fail "chromium could not open the checked report"
[ -z "$(console_lines)" ] || fail "the checked report logs to the console: $(console_lines)"
grep -q 'CHECKS-OK' "$WORK/dom" || fail "the rendered report: $(grep -o 'PROBLEMS[^<]*' "$WORK/dom" | head -c 3000)"
echo "report checks in the browser: $(grep -o 'CHECKS-OK [0-9]*' "$WORK/dom")"

# the checks bite: a page wider than the viewport and a tick like "1e-5.4" are found
sed -e 's|</style>|body { min-width: 1500px; }</style>|' -e '0,/<tspan[^>]*>/s|<tspan[^>]*>|e-5.4<tspan>|' "$WORK/report/checked.html" > "$WORK/report/broken.html"
chromium_open "$WORK/report/broken.html" --window-size=1280,2000 --dump-dom || fail "chromium could not open the broken report"
grep -q 'px wide in a 1280 px viewport' "$WORK/dom" || fail "the width check misses a page wider than the viewport"
grep -q 'is not a decade' "$WORK/dom" || fail "the tick check misses a non-decade tick"

mkdir -p "$(dirname "$SHOT")"
chromium_open "$page" --window-size=1280,3200 --screenshot="$SHOT" || fail "no screenshot"
[ "$(head -c 4 "$SHOT" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$SHOT is not a PNG"
[ -z "$(console_lines)" ] || fail "the report logs to the console while rendering: $(console_lines)"
echo "screenshot: $SHOT"
finish
