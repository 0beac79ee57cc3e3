// The HTML report: one self-contained page (no external resources), charts drawn as
// inline SVG here, a few lines of script for the "failures only" filter.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pugixml.hpp>

#include "budgets.h"
#include "headroom.h"
#include "python_canary.h"
#include "registry.h"
#include "reports.h"
#include "run_option_fields.h"

namespace harness::nightly {
namespace {

using nlohmann::json;

// Style and script are raw text in HTML; they are spliced in after serialisation, where
// the XML writer cannot escape their characters.
constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d2430; max-width: 1200px; overflow-wrap: anywhere; }
h1 .pass, td.pass { color: #137333; } h1 .fail, td.fail { color: #b3261e; } h1 .error, td.error, div.warn { color: #a05a00; } div.fail { color: #b3261e; }
table { border-collapse: collapse; margin: 8px 0 16px; max-width: 100%; }
th, td { border: 1px solid #d5d9e0; padding: 4px 8px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f3f5f8; }
code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f8fa; padding: 8px; white-space: pre-wrap; overflow-wrap: anywhere; max-width: 100%; box-sizing: border-box; }
pre.command { border-left: 3px solid #1f5fbf; }
section.lane { border-top: 1px solid #d5d9e0; margin-top: 24px; }
section.lane[data-status=fail] > h3 { color: #b3261e; } section.lane[data-status=error] > h3 { color: #a05a00; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; max-width: 100%; } figure h4 { margin: 4px 0; font-size: 13px; }
figure.failing h4 { color: #b3261e; }
figure svg.chart { max-width: 100%; height: auto; display: block; }
figure.exact { width: 560px; max-width: 100%; }
figcaption { font-size: 12px; color: #5f6b7a; max-width: 560px; }
ul.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 4px 16px; padding: 0; margin: 2px 0 4px 70px; font-size: 12px; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
div.commands { border: 1px solid #e3c4c1; background: #fdf6f5; padding: 4px 12px; margin: 12px 0; border-radius: 4px; }
div.commands h4 { margin: 6px 0; }
div.commands p { margin: 6px 0 2px; }
.muted { color: #5f6b7a; }
strong.fragile { color: #a05a00; margin-left: 6px; }
strong.provisional { display: block; color: #a05a00; font-weight: normal; font-size: 12px; }
tr.hidden { display: none; }
)";

constexpr const char* kScript = R"(
document.getElementById('failures-only').addEventListener('change', function (event) {
  document.querySelectorAll('#verdicts tbody tr').forEach(function (row) {
    row.classList.toggle('hidden', event.target.checked && row.dataset.status === 'pass');
  });
});
document.body.dataset.ready = 'yes';
)";

pugi::xml_node add(pugi::xml_node parent, const char* tag, const std::string& text = "", const std::string& css = "") {
  pugi::xml_node node = parent.append_child(tag);
  if (!text.empty()) node.text().set(text.c_str());
  if (!css.empty()) node.append_attribute("class") = css.c_str();
  return node;
}

// A number in shell words: as is when it is plain, else single-quoted.
using run::shell_word;

// "Nice" tick spacing: 1, 2 or 5 times a power of ten, about `range / count`.
double nice_step(double range, int count) {
  const double raw = range / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power * (1 + 1e-9)) return m * power;
  }
  return 10 * power;
}

// A line chart of several series over the steps, linear or log10 on y: axes with ticks
// (decades on a log axis, written 10 with a superscript), a label on each axis, and a
// legend of colour swatches under the plot.
class Chart {
 public:
  Chart(int steps, bool log_y, std::string y_label, std::string x_label = "step")
      : steps_(std::max(steps, 2)), log_y_(log_y), y_label_(std::move(y_label)), x_label_(std::move(x_label)) {}

  // `values` per step from 0, or at `steps` (a series sampled at some steps: each a dot).
  void series(const std::string& name, const json& values, const std::string& colour, bool dashed = false,
              const json& steps = json()) {
    std::vector<double> v;
    for (const json& x : values) v.push_back(x.is_number() ? x.get<double>() : std::nan(""));
    std::vector<int> at;
    if (steps.is_array()) {
      for (const json& s : steps) at.push_back(s.is_number_integer() ? s.get<int>() : -1);
    }
    lines_.push_back({name, colour, dashed, v, at});
  }
  // A vertical marker at `step` (the first failing step).
  void marker(int step, const std::string& text) { markers_.push_back({step, text}); }

  pugi::xml_node draw(pugi::xml_node parent, const std::string& caption, const std::string& css = "") const {
    const auto [lo, hi] = y_range();
    pugi::xml_node figure = add(parent, "figure", "", css);
    pugi::xml_node svg = figure.append_child("svg");
    svg.append_attribute("xmlns") = "http://www.w3.org/2000/svg";
    svg.append_attribute("viewBox") = fmt::format("0 0 {} {}", kWidth, kHeight).c_str();
    svg.append_attribute("width") = kWidth;
    svg.append_attribute("height") = kHeight;
    svg.append_attribute("class") = log_y_ ? "chart log" : "chart linear";
    svg.append_attribute("role") = "img";
    add(svg, "title", caption);
    frame(svg, lo, hi);
    for (const Line& l : lines_) if (!l.dashed) polyline(svg, l, lo, hi);
    for (const Line& l : lines_) if (l.dashed) polyline(svg, l, lo, hi);
    for (const auto& [step, text] : markers_) {
      if (step < 0 || step >= steps_) continue;
      pugi::xml_node m = svg.append_child("line");
      m.append_attribute("class") = "marker";
      m.append_attribute("x1") = px(step);
      m.append_attribute("x2") = px(step);
      m.append_attribute("y1") = kTop;
      m.append_attribute("y2") = kHeight - kBottom;
      m.append_attribute("stroke") = "#b3261e";
      m.append_attribute("stroke-dasharray") = "2 3";
      const bool right = px(step) > (kLeft + kWidth) / 2.0;
      label(svg, px(step) + (right ? -4 : 4), kTop + 12, text, right ? "end" : "start", "marker-label").append_attribute("fill") = "#b3261e";
    }
    legend(figure);
    add(figure, "figcaption", caption);
    return figure;
  }

 private:
  static constexpr int kWidth = 560, kHeight = 270, kLeft = 70, kRight = 14, kTop = 10, kBottom = 44;
  struct Line {
    std::string name, colour;
    bool dashed;
    std::vector<double> values;
    std::vector<int> steps;  // empty: values[s] is step s
    int step_of(std::size_t i) const { return steps.empty() ? static_cast<int>(i) : steps.at(i); }
  };

  double y_of(double v) const { return log_y_ ? std::log10(v) : v; }

  // The linear axis' tick spacing: that of the data's range (y_range widens to it).
  double linear_step() const {
    const auto [lo, hi] = data_range();
    return nice_step(hi - lo, 4);
  }

  // The data's range, widened to whole decades (log) or to whole tick steps (linear).
  std::pair<double, double> y_range() const {
    auto [lo, hi] = data_range();
    if (log_y_) {
      lo = std::floor(lo), hi = std::ceil(hi);
      if (hi - lo < 1) hi = lo + 1;
      return {lo, hi};
    }
    const double step = linear_step();
    return {std::floor(lo / step) * step, std::ceil(hi / step) * step};
  }

  std::pair<double, double> data_range() const {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const Line& l : lines_) {
      for (double v : l.values) {
        if (!std::isfinite(v) || (log_y_ && v <= 0)) continue;
        lo = std::min(lo, y_of(v));
        hi = std::max(hi, y_of(v));
      }
    }
    if (!std::isfinite(lo)) lo = log_y_ ? -1 : 0, hi = log_y_ ? 0 : 1;
    if (!log_y_ && hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) lo -= 0.5, hi += 0.5;
    return {lo, hi};
  }

  double px(int step) const { return kLeft + (kWidth - kLeft - kRight) * step / double(steps_ - 1); }
  double py(double y, double lo, double hi) const { return kTop + (kHeight - kTop - kBottom) * (1 - (y - lo) / (hi - lo)); }

  void grid(pugi::xml_node svg, double y) const {
    pugi::xml_node g = svg.append_child("line");
    g.append_attribute("x1") = kLeft;
    g.append_attribute("x2") = kWidth - kRight;
    g.append_attribute("y1") = y;
    g.append_attribute("y2") = y;
    g.append_attribute("stroke") = "#eceff3";
  }

  void frame(pugi::xml_node svg, double lo, double hi) const {
    if (log_y_) {
      const int decades = static_cast<int>(std::lround(hi - lo));
      const int every = std::max(1, (decades + 5) / 6);  // at most about 6 labels
      for (int e = static_cast<int>(std::lround(lo)); e <= static_cast<int>(std::lround(hi)); e += every) {
        const double y = py(e, lo, hi);
        grid(svg, y);
        pugi::xml_node t = label(svg, kLeft - 6, y + 4, "10", "end", "tick y");
        if (e != 0) {  // 10 with the exponent as a superscript: 10⁻⁵ reads "10−5" as text
          pugi::xml_node sup = t.append_child("tspan");
          sup.append_attribute("dy") = -5;
          sup.append_attribute("font-size") = 9;
          sup.text().set((e < 0 ? "\u2212" + std::to_string(-e) : std::to_string(e)).c_str());
        } else {
          t.text().set("1");
        }
      }
    } else {
      const double step = linear_step();
      const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
      for (double v = lo; v <= hi + step * 1e-6; v += step) {
        const double y = py(v, lo, hi);
        grid(svg, y);
        label(svg, kLeft - 6, y + 4, fmt::format("{:.{}f}", v, decimals), "end", "tick y");
      }
    }
    pugi::xml_node box = svg.append_child("rect");
    box.append_attribute("x") = kLeft;
    box.append_attribute("y") = kTop;
    box.append_attribute("width") = kWidth - kLeft - kRight;
    box.append_attribute("height") = kHeight - kTop - kBottom;
    box.append_attribute("fill") = "none";
    box.append_attribute("stroke") = "#c4cad3";
    const int x_step = std::max(1, static_cast<int>(nice_step(steps_ - 1, 5)));
    for (int s = 0; s < steps_; s += x_step) label(svg, px(s), kHeight - kBottom + 14, std::to_string(s), "middle", "tick x");
    if ((steps_ - 1) % x_step != 0 && (steps_ - 1) % x_step > x_step / 2) {
      label(svg, px(steps_ - 1), kHeight - kBottom + 14, std::to_string(steps_ - 1), "middle", "tick x");
    }
    label(svg, (kLeft + kWidth - kRight) / 2.0, kHeight - 8, x_label_, "middle", "axis-label x");
    const double mid = kTop + (kHeight - kTop - kBottom) / 2.0;
    pugi::xml_node y = label(svg, 14, mid, y_label_, "middle", "axis-label y");
    y.append_attribute("transform") = fmt::format("rotate(-90 14 {:.1f})", mid).c_str();
  }

  static pugi::xml_node label(pugi::xml_node svg, double x, double y, const std::string& text, const char* anchor,
                              const char* css) {
    pugi::xml_node t = svg.append_child("text");
    t.append_attribute("x") = x;
    t.append_attribute("y") = y;
    t.append_attribute("font-size") = 11;
    t.append_attribute("fill") = "#3c4450";
    t.append_attribute("text-anchor") = anchor;
    t.append_attribute("class") = css;
    t.text().set(text.c_str());
    return t;
  }

  void polyline(pugi::xml_node svg, const Line& l, double lo, double hi) const {
    std::string points;
    const std::size_t n = l.steps.empty() ? l.values.size() : std::min(l.values.size(), l.steps.size());
    for (std::size_t i = 0; i < n; ++i) {
      const double v = l.values[i];
      const int step = l.step_of(i);
      if (!std::isfinite(v) || step < 0 || step >= steps_) continue;
      // Zero on a log scale (an exact step) sits on the bottom edge.
      const double y = log_y_ && v <= 0 ? lo : std::clamp(y_of(v), lo, hi);
      points += fmt::format("{:.1f},{:.1f} ", px(step), py(y, lo, hi));
      if (!l.steps.empty()) dot(svg, px(step), py(y, lo, hi), l);
    }
    pugi::xml_node p = svg.append_child("polyline");
    p.append_attribute("points") = points.c_str();
    p.append_attribute("fill") = "none";
    p.append_attribute("stroke") = l.colour.c_str();
    // Solid lines wide and under the dashed ones: where the series agree, both show.
    p.append_attribute("stroke-width") = l.dashed ? 1.6 : 3.0;
    if (!l.dashed) p.append_attribute("stroke-opacity") = 0.75;
    if (l.dashed) p.append_attribute("stroke-dasharray") = "6 3";
    add(p, "title", l.name);
  }

  // A sampled series' point: a dot, so that one evaluation shows, and each is told apart.
  static void dot(pugi::xml_node svg, double x, double y, const Line& l) {
    pugi::xml_node c = svg.append_child("circle");
    c.append_attribute("class") = "sample";
    c.append_attribute("cx") = fmt::format("{:.1f}", x).c_str();
    c.append_attribute("cy") = fmt::format("{:.1f}", y).c_str();
    c.append_attribute("r") = l.dashed ? 2.5 : 3.5;
    c.append_attribute("fill") = l.dashed ? "none" : l.colour.c_str();
    c.append_attribute("stroke") = l.colour.c_str();
  }

  // The legend: one swatch (the series' line, dashed as drawn) and its name per series.
  void legend(pugi::xml_node figure) const {
    pugi::xml_node list = add(figure, "ul", "", "legend");
    for (const Line& l : lines_) {
      pugi::xml_node item = add(list, "li");
      pugi::xml_node swatch = item.append_child("svg");
      swatch.append_attribute("xmlns") = "http://www.w3.org/2000/svg";
      swatch.append_attribute("class") = "swatch";
      swatch.append_attribute("width") = 28;
      swatch.append_attribute("height") = 10;
      swatch.append_attribute("aria-hidden") = "true";
      pugi::xml_node line = swatch.append_child("line");
      line.append_attribute("x1") = 1;
      line.append_attribute("x2") = 27;
      line.append_attribute("y1") = 5;
      line.append_attribute("y2") = 5;
      line.append_attribute("stroke") = l.colour.c_str();
      line.append_attribute("stroke-width") = 3;
      if (l.dashed) line.append_attribute("stroke-dasharray") = "6 3";
      add(item, "span", l.name);
    }
  }

  int steps_;
  bool log_y_;
  std::string y_label_, x_label_;
  std::vector<Line> lines_;
  std::vector<std::pair<int, std::string>> markers_;
};

std::string check_cell(const json& lane, const std::string& which) {
  for (const json& c : lane["checks"]) {
    if (json_text(c, "check") == which || (which == "golden" && json_text(c, "check") == "run")) {
      return fmt::format("{}: {}", json_text(c, "status"), json_text(c, "summary"));
    }
  }
  return "—";
}

void stack_table(pugi::xml_node parent, const json& stack, const json& common);

// The stack every lane shares: the first lane's that ran.
json common_stack(const json& summary) {
  for (const json& lane : summary["lanes"]) {
    if (lane.contains("stack")) return lane["stack"];
  }
  return json::object();
}

// "12%: reference loss at step 7 (noise + bf16)", the lane's least headroom over the
// checks judged against a tolerance, marked fragile when the lane passed with under
// kFragileHeadroomPct; "—" where no check was (a bitwise lane, an error).
void headroom_cell(pugi::xml_node row, const json& lane) {
  const json headroom = lane.value("headroom", json(nullptr));
  pugi::xml_node cell = add(row, "td", "", "headroom");
  if (!headroom.is_object()) {
    cell.text().set("—");
    return;
  }
  const json& pct = headroom["headroom_pct"];
  std::vector<std::string> features;
  for (const json& f : headroom.value("features", json::array())) features.push_back(f.is_string() ? f.get<std::string>() : f.dump());
  cell.append_child(pugi::node_pcdata)
      .set_value(fmt::format("{}: {} {} at step {} ({}) ", pct.is_number() ? fmt::format("{:.0f}%", pct.get<double>()) : "none",
                             json_text(headroom, "check"), json_text(headroom, "metric"), headroom.value("step", json(nullptr)).dump(),
                             fmt::join(features, " + "))
                     .c_str());
  if (lane.value("fragile", false)) {
    add(cell, "strong", "fragile", "fragile")
        .append_attribute("title") = fmt::format("passed with under {:.0f}% of its budget left", kFragileHeadroomPct).c_str();
  }
}

// "provisional: [bf16] from 3 samples" under the lane's name when a check judged it under an
// entry calibrated from fewer than kMinCalibrationSamples samples (docs/budgets.md, "Samples").
void provisional_mark(pugi::xml_node cell, const json& lane) {
  std::map<std::string, std::string> entries;  // one per entry, whichever checks used it
  for (const json& c : lane["checks"]) {
    const json verdict = c.value("verdict", json(nullptr));  // an error judged nothing
    const json budget = verdict.is_object() ? verdict.value("budget", json::object()) : json::object();
    const json samples = budget.value("samples", json::object());
    for (const json& key : budget.value("provisional", json::array())) {
      const std::string name = key.get<std::string>();
      const int n = samples.value(name, 0);
      entries[name] = fmt::format("[{}] from {} sample{}", name, n, n == 1 ? "" : "s");
    }
  }
  if (entries.empty()) return;
  std::vector<std::string> named;
  for (const auto& [name, text] : entries) named.push_back(text);
  add(cell, "strong", fmt::format("provisional: {}", fmt::join(named, ", ")), "provisional")
      .append_attribute("title") = fmt::format("judged under an entry calibrated from fewer than {} samples",
                                               check::kMinCalibrationSamples).c_str();
}

void verdict_table(pugi::xml_node body, const json& summary) {
  pugi::xml_node filter = add(body, "label");
  pugi::xml_node box = filter.append_child("input");
  box.append_attribute("type") = "checkbox";
  box.append_attribute("id") = "failures-only";
  filter.append_child(pugi::node_pcdata).set_value(" failures and errors only");
  pugi::xml_node table = add(body, "table");
  table.append_attribute("id") = "verdicts";
  pugi::xml_node head = add(table, "thead").append_child("tr");
  for (const char* h : {"lane", "id", "status", "golden", "reference", "least headroom", "seconds"}) add(head, "th", h);
  pugi::xml_node rows = add(table, "tbody");
  for (const json& lane : summary["lanes"]) {
    const std::string status = json_text(lane, "status");
    pugi::xml_node row = rows.append_child("tr");
    row.append_attribute("data-status") = status.c_str();
    pugi::xml_node name = add(row, "td");
    pugi::xml_node link = name.append_child("a");
    link.append_attribute("href") = ("#lane-" + json_text(lane, "id")).c_str();
    add(link, "code", json_text(lane, "lane"));
    provisional_mark(name, lane);
    add(row, "td", json_text(lane, "id"));
    add(row, "td", status, status);
    add(row, "td", check_cell(lane, "golden"));
    pugi::xml_node reference = add(row, "td", check_cell(lane, "reference"));
    for (const json& c : lane["checks"]) {  // a bias or restart gate check: its line under the reference's
      const std::string check = json_text(c, "check");
      if (check != "bias" && check != "resume") continue;
      const std::string outcome = json_text(c, "status");
      add(reference, "div", fmt::format("{} {}: {}", check, outcome, json_text(c, "summary")), outcome);
    }
    headroom_cell(row, lane);
    add(row, "td", fmt::format("{:.1f}", lane.value("seconds", 0.0)));
  }
}

// The negative controls (docs/nightly.md): what each showed; blind or error is the job's error.
void controls_table(pugi::xml_node body, const json& controls) {
  if (controls.empty()) return;
  add(body, "h2", "Negative controls");
  pugi::xml_node table = add(body, "table");
  table.append_attribute("id") = "controls";
  pugi::xml_node head = add(table, "thead").append_child("tr");
  for (const char* h : {"control", "status", "what it showed", "seconds"}) add(head, "th", h);
  pugi::xml_node rows = add(table, "tbody");
  for (const json& control : controls) {
    const std::string status = json_text(control, "status");
    pugi::xml_node row = rows.append_child("tr");
    add(row, "td", json_text(control, "control"));
    add(row, "td", status, status == "seen" ? "pass" : status == "skipped" ? "muted" : "error");
    add(row, "td", json_text(control, "summary"));
    add(row, "td", fmt::format("{:.1f}", control.value("seconds", 0.0)));
  }
}

std::string budget_names(const json& envelope) {
  return fmt::format("{}", fmt::join(envelope["budget"].get<std::vector<std::string>>(), " + "));
}

// What a metric's deviation is, for the y axis.
std::string deviation_label(const std::string& metric) {
  if (metric == "params_sketch") return "|Δ params sketch| (L2)";
  if (metric == "grad_norm") return "|Δ grad norm|";
  if (metric == "loss") return "|Δ loss| (nats)";
  if (metric == "logit_kl") return "KL(reference ‖ run) (nats)";
  if (metric == "logprob_delta") return "max |Δ log p(target)|";
  if (metric == "top1_mismatch") return "top-1 mismatch (fraction)";
  return "|Δ " + metric + "|";
}

// "12% headroom" for a metric within its budget; how far over it for one that fails.
std::string headroom_text(const json& metric) {
  const json& h = metric.value("headroom_pct", json(nullptr));
  const json& first = metric.value("first_failing_step", json(nullptr));
  const bool fails = metric.contains("pass") && metric["pass"].is_boolean() && !metric["pass"].get<bool>();
  const std::string from = first.is_number_integer() ? fmt::format(" from step {}", first.get<int>()) : "";
  if (!h.is_number()) return fmt::format("fails{}: a NaN, or a move where the budget is exact", from);
  const double headroom = h.get<double>();
  if (fails || headroom < 0) return fmt::format("fails{}: worst step {:.3g}x the allowance", from, 1 - headroom / 100);
  return fmt::format("{:.0f}% headroom", headroom);
}

// The tolerance-judged metrics of an envelope, tightest first; a summary written before
// the per-metric keys has only the loss.
std::vector<json> envelope_metrics(const json& envelope) {
  std::vector<json> metrics;
  if (envelope.contains("metrics") && envelope["metrics"].is_array()) {
    for (const json& m : envelope["metrics"]) metrics.push_back(m);
  } else if (envelope.contains("loss_deviation")) {
    metrics.push_back({{"metric", "loss"}, {"deviation", envelope["loss_deviation"]},
                       {"allowed", envelope.value("loss_allowed", json::array())}, {"headroom_pct", nullptr}});
  }
  auto headroom = [](const json& m) {
    const json& h = m.value("headroom_pct", json(nullptr));
    return h.is_number() ? h.get<double>() : -std::numeric_limits<double>::infinity();
  };
  std::stable_sort(metrics.begin(), metrics.end(), [&](const json& a, const json& b) { return headroom(a) < headroom(b); });
  return metrics;
}

void charts(pugi::xml_node section, const json& lane, int steps) {
  const json& series = lane["series"];
  if (!series.contains("loss")) return;
  pugi::xml_node row = add(section, "div", "", "charts");
  Chart loss(steps, false, "loss (nats)");
  loss.series("this run", series["loss"], "#1f5fbf");
  if (series.contains("golden_loss")) loss.series("golden", series["golden_loss"], "#e08a00", true);
  if (series.contains("reference_loss")) loss.series("reference lane", series["reference_loss"], "#3c4450", true);
  loss.draw(row, "Loss per step: this run, its golden and the reference lane.", "loss");
  if (!series.contains("envelope")) return;
  const json& envelope = series["envelope"];
  // The reference lane's envelope is against its golden; every other lane's against the reference lane.
  const bool against_golden = std::none_of(lane["checks"].begin(), lane["checks"].end(),
                                           [](const json& c) { return json_text(c, "check") == "reference"; });
  const std::string against = against_golden ? "golden" : json_text(envelope, "against");
  const std::vector<json> metrics = envelope_metrics(envelope);
  add(section, "p",
      fmt::format("Divergence from {} per judged metric against the budget envelope ({}), tightest first (least headroom); "
                  "log scale, exact steps on the bottom edge.",
                  against, budget_names(envelope)),
      "muted");
  pugi::xml_node grid = add(section, "div", "", "charts divergences");
  for (const json& m : metrics) {
    const std::string name = json_text(m, "metric");
    const json& deviation = m["deviation"];
    const json& allowed = m["allowed"];
    const bool exact = std::all_of(deviation.begin(), deviation.end(), [](const json& d) { return d.is_number() && d.get<double>() == 0; });
    const bool has_envelope = std::any_of(allowed.begin(), allowed.end(), [](const json& a) { return a.is_number() && a.get<double>() > 0; });
    const bool failing = m.contains("pass") && m["pass"].is_boolean() && !m["pass"].get<bool>();
    const std::string title = fmt::format("{}: {}", name, headroom_text(m));
    // A held-out logit metric is a value at each evaluation (`steps`), not a difference per step.
    const json& sampled_at = m.value("steps", json());
    pugi::xml_node figure;
    if (exact) {
      figure = add(grid, "figure", "", "divergence exact");
      std::string where = "at every step";
      if (sampled_at.is_array()) {
        std::vector<std::string> at;
        for (const json& step : sampled_at) at.push_back(step.dump());
        where = fmt::format("at every held-out evaluation (steps {})", fmt::join(at, ", "));
      }
      add(figure, "p", fmt::format("{}: equal to {} {} (budget: {}).", name, against, where, budget_names(envelope)),
          "muted");
    } else {
      int last = steps - 1;  // the evaluation after a run's last step is at step `steps`
      for (const json& step : sampled_at) last = std::max(last, step.is_number_integer() ? step.get<int>() : last);
      Chart chart(last + 1, true, deviation_label(name));
      const std::string shown = sampled_at.is_array() ? fmt::format("{} against {}", name, against)
                                                      : fmt::format("|{} − {}|", name, against);
      chart.series(shown, deviation, "#b3261e", false, sampled_at);
      if (has_envelope) chart.series("budget envelope (allowed)", allowed, "#137333", true, sampled_at);
      const json& first = m.value("first_failing_step", json(nullptr));
      if (first.is_number_integer()) chart.marker(first.get<int>(), fmt::format("first failing step {}", first.get<int>()));
      const std::string tensor = json_text(m, "worst_tensor");
      figure = chart.draw(grid,
                          fmt::format("{} {} {}{}{}.", name,
                                      sampled_at.is_array() ? "of the held-out logits, at each evaluation, against"
                                                            : "divergence from",
                                      against,
                                      has_envelope ? " against the budget envelope" : " (the budget is exact: any deviation fails)",
                                      tensor.empty() ? "" : fmt::format("; per step its worst tensor (worst step: {})", tensor)),
                          failing ? "divergence failing" : "divergence");
      figure.insert_child_before("h4", figure.first_child()).text().set(title.c_str());
    }
    figure.append_attribute("data-metric") = name.c_str();
    const json& h = m.value("headroom_pct", json(nullptr));
    figure.append_attribute("data-headroom") = h.is_number() ? fmt::format("{:.6g}", h.get<double>()).c_str() : "none";
  }
}

// Each lane's least headroom over the previous nightlies (--history) and this one, last,
// against the fragile line: a lane drifting toward its budget shows before it fails.
void history_section(pugi::xml_node body, const json& summary) {
  const json history = summary.value("history", json(nullptr));
  if (!history.is_object() || history.empty()) return;
  constexpr double kFloor = -100;  // a failing nightly at many times its allowance would flatten the rest
  add(body, "h2", "Headroom over time");
  add(body, "p",
      fmt::format("Each lane's least headroom (over its checks judged against a tolerance) in the previous nightlies "
                  "read with --history, oldest first, and in this one, last; below the dashed line at {:.0f}% a "
                  "passing lane is fragile. A failing nightly shows at {:.0f}% or above; a nightly without a "
                  "tolerance-judged check for the lane has no point.",
                  kFragileHeadroomPct, kFloor),
      "muted");
  pugi::xml_node grid = add(body, "div", "", "charts history");
  grid.append_attribute("id") = "history";
  for (const json& lane : summary["lanes"]) {
    const std::string id = json_text(lane, "id");
    if (!history.contains(id) || !history[id].is_array() || history[id].empty()) continue;
    const json& points = history[id];
    const int count = static_cast<int>(points.size());
    json values = json::array(), at = json::array(), line = json::array();
    for (int i = 0; i < count; ++i) {
      const json pct = points[i].value("headroom_pct", json(nullptr));
      values.push_back(pct.is_number() ? json(std::max(pct.get<double>(), kFloor)) : json(nullptr));
      at.push_back(i);
    }
    if (std::none_of(values.begin(), values.end(), [](const json& v) { return v.is_number(); })) {
      add(grid, "p", fmt::format("{}: no check judged against a tolerance in any of these {} nightlies.", id, count),
          "muted history-none");
      continue;
    }
    for (int i = 0; i < std::max(count, 2); ++i) line.push_back(kFragileHeadroomPct);
    Chart chart(count, false, "least headroom (%)", "nightly (oldest first)");
    chart.series("least headroom", values, "#1f5fbf", false, at);
    chart.series(fmt::format("fragile below {:.0f}%", kFragileHeadroomPct), line, "#a05a00", true);
    pugi::xml_node figure =
        chart.draw(grid,
                   fmt::format("{} ({}): least headroom in {} nightlies, {} to {} (this one).", json_text(lane, "lane"), id,
                               count, json_text(points.front(), "started_utc"), json_text(points.back(), "started_utc")),
                   "history");
    figure.insert_child_before("h4", figure.first_child()).text().set(id.c_str());
    figure.append_attribute("data-lane") = id.c_str();
  }
}

// The recipe of a receipt (its manifest's run_options) as a `harness run` command line.
// A Python canary's recipe (canary_harness.runs.runner.manifest_for): the interpreter it ran under
// is part of it, and it names FILE.py:NAME; a harness engine's names its engine.
bool is_python_recipe(const json& recipe) {
  return recipe.contains("python") && recipe.contains("canary") && !recipe.contains("engine");  // a lane's names its pack
}
// A harness engine's recipe (run::replay_recipe): it names its engine and canary.
bool is_engine_recipe(const json& recipe) { return recipe.contains("engine") && recipe.contains("canary"); }

// `python`: the interpreter the lane ran under as the matrix named it ("" for the one the
// recipe recorded, sys.executable: a wrapper script that sets up its environment and execs
// another interpreter records that other one).
std::string python_run_command(const json& recipe, const std::string& out, int checkpoint_every,
                               const std::string& python) {
  std::vector<std::string> words;  // the environment the harness gives its own Python children
  for (const auto& [name, value] : run::python_package_environment()) {
    // PYTHONPATH: the package first, then the caller's own, as run::run_child sets it
    words.push_back(name + "=" + shell_word(value) + (name == "PYTHONPATH" ? "${PYTHONPATH:+:$PYTHONPATH}" : ""));
  }
  words.insert(words.end(), {shell_word(python.empty() ? json_text(recipe, "python", "python3") : python), "-m",
                             "canary_harness", "run", shell_word(json_text(recipe, "canary"))});
  for (const char* flag : {"device", "precision"}) {
    if (recipe.contains(flag)) words.insert(words.end(), {fmt::format("--{}", flag), shell_word(json_text(recipe, flag))});
  }
  for (const char* flag : {"threads", "steps", "seed"}) {
    if (recipe.contains(flag)) words.insert(words.end(), {fmt::format("--{}", flag), recipe[flag].dump()});
  }
  if (recipe.contains("inject_fault") && recipe["inject_fault"].is_string()) {
    words.insert(words.end(), {"--inject-fault", shell_word(recipe["inject_fault"].get<std::string>())});
  }
  if (json_text(recipe, "trace") == "ops") words.insert(words.end(), {"--trace", "ops"});
  if (recipe.value("compile", false) == true) words.push_back("--compile");
  if (recipe.value("versioned", false) == true) words.push_back("--versioned");
  if (checkpoint_every > 0) words.insert(words.end(), {"--checkpoint-every", std::to_string(checkpoint_every)});
  words.insert(words.end(), {"--out", shell_word(out)});
  return fmt::format("{}", fmt::join(words, " "));
}

// The command that runs a lane again from its receipt's recipe: `harness run` for the
// harness's engines, `python3 -m canary_harness run` for a Python canary.
std::string run_command(const json& recipe, const std::string& out, int checkpoint_every = 0,
                        const std::string& python = "") {
  if (is_python_recipe(recipe)) return python_run_command(recipe, out, checkpoint_every, python);
  run::RunOptions options;
  try {
    options = run::options_from_recipe(recipe);
  } catch (const run::UsageError& e) {  // a damaged recipe: say so where the command would be
    return fmt::format("# the receipt's recipe cannot be run again ({})", e.what());
  }
  if (checkpoint_every > 0) options.checkpoint_every = checkpoint_every;
  std::vector<std::string> words = run::run_command_words(options);
  words.insert(words.end(), {"--out", shell_word(out)});
  return fmt::format("{}", fmt::join(words, " "));
}

// ", reduction order seed S (--FLAG)" for a recipe that sets the seed of its engine's
// reduction order (the flag that says so: EngineFlag::seeds_reduction_order), else "".
std::string reduction_seed_note(const json& recipe) {
  if (!is_engine_recipe(recipe) || !recipe.contains("engine_options") || !recipe["engine_options"].is_object()) return "";
  for (const auto& [flag, value] : recipe["engine_options"].items()) {
    const DescribedFlag* described = find_engine_flag(flag);
    if (described != nullptr && described->flag.seeds_reduction_order) {
      return fmt::format(", reduction order seed {} (--{})", value.is_string() ? value.get<std::string>() : value.dump(),
                         flag);
    }
  }
  return "";
}

void command_block(pugi::xml_node parent, const std::string& what, const std::string& command, const std::string& note = "") {
  add(parent, "p", what);
  add(parent, "pre", command, "command");  // text only: the writer indents child elements
  if (!note.empty()) add(parent, "p", note, "muted");
}

// Environment drift (docs/nightly.md): the moved stack entries by how they group with the
// failing lanes, the reruns with the golden's value, the whole-matrix refresh.
void drift_section(pugi::xml_node body, const json& drift) {
  if (!drift.is_object()) return;
  add(body, "h2", "Environment drift");
  add(body, "p", json_text(drift, "summary"));
  pugi::xml_node table = add(body, "table");
  table.append_attribute("id") = "drift";
  pugi::xml_node head = add(table, "thead").append_child("tr");
  for (const char* h : {"stack entry", "golden -> run", "failing lanes", "passing lanes", "set by"}) add(head, "th", h);
  pugi::xml_node rows = add(table, "tbody");
  for (const json& entry : drift["entries"]) {
    pugi::xml_node row = rows.append_child("tr");
    add(row, "td", json_text(entry, "entry"), entry.value("explains", false) ? "fail" : "");
    add(row, "td", fmt::format("{}", fmt::join(entry["moves"].get<std::vector<std::string>>(), "; ")));
    add(row, "td", fmt::format("{} ({})", entry["failing"].get<int>(),
                               fmt::join(entry["lanes"].get<std::vector<std::string>>(), ", ")));
    add(row, "td", std::to_string(entry["passing"].get<int>()));
    const json& set_by = entry["set_by"];
    add(row, "td", set_by.is_object() ? set_by.begin().value().get<std::string>() : "no rerun can set it", "muted");
  }
  for (const json& rerun : drift["reruns"]) {
    command_block(body, fmt::format("Rerun the lanes where {} moved, with the golden's value:", json_text(rerun, "entry")),
                  json_text(rerun, "command"));
  }
  command_block(body, "Or make the new stack the goldens': one refresh of the whole matrix, one candidate set to review:",
                fmt::format("{}", fmt::join(drift["refresh"].get<std::vector<std::string>>(), "\n")));
}

// Per failing lane: the commands that reproduce the run, bisect it against what it failed
// and replay it from its first failing step.
void reproduce(pugi::xml_node section, const json& lane, const json& summary) {
  if (json_text(lane, "status") != "fail") return;
  const json envelope = lane["series"].value("envelope", json::object());
  const std::string receipt = json_text(envelope, "receipt", json_text(lane, "receipt"));
  const json recipe = envelope.value("run_options", json(nullptr));
  pugi::xml_node box = add(section, "div", "", "commands");
  add(box, "h4", "Reproduce, bisect, replay");
  const std::string id = json_text(lane, "id");
  const std::string python = json_text(lane, "python");  // a Python canary lane's interpreter, as the matrix names it
  // A PyTorch lane's receipt is replayed from the canary pack it names (the job's, beside the report).
  const std::string pack = recipe.is_object() && recipe.contains("pack") && !recipe.contains("canary")
                               ? " --pack " + shell_word(json_text(recipe, "pack"))
                               : "";
  int first_failing = -1;
  for (const json& check : lane["checks"]) {
    if (json_text(check, "status") != "fail" || !check.contains("verdict")) continue;
    const json& f = check["verdict"].value("first_failing_step", json(nullptr));
    if (f.is_number_integer() && (first_failing < 0 || f.get<int>() < first_failing)) first_failing = f.get<int>();
  }
  if (is_engine_recipe(recipe) || is_python_recipe(recipe)) {
    command_block(box,
                  fmt::format("Run the lane again (its receipt's recipe: seed {}{}):", recipe.value("seed", json(nullptr)).dump(),
                              reduction_seed_note(recipe)),
                  run_command(recipe, id + ".h5", 0, python));
  } else {  // a command lane, the PyTorch lane on the canary pack: the job's own way of running it, that lane alone
    const json matrix = summary.value("matrix", json::object());
    command_block(box, "Run the lane again (its receipt records no recipe: the nightly runs it, alone):",
                  fmt::format("harness nightly --matrix {} --budgets {} --goldens {} --lanes {} --out {}",
                              shell_word(json_text(matrix, "path")),
                              shell_word(json_text(summary.value("budgets", json::object()), "path")),
                              shell_word(json_text(summary, "goldens")), shell_word(id), shell_word(id + "-again")));
  }
  for (const json& check : lane["checks"]) {
    if (json_text(check, "status") != "fail" || !check.contains("verdict")) continue;  // a comparison's: bisect it
    command_block(box,
                  fmt::format("Bisect against the {} ({}): the first step, tensor and op where the two part:", json_text(check, "check"),
                              json_text(check, "check") == "golden" ? "golden" : json_text(envelope, "against", "reference lane")),
                  fmt::format("harness bisect {} {}{}", shell_word(receipt), shell_word(json_text(check, "against")), pack));
  }
  for (const json& check : lane["checks"]) {
    if (json_text(check, "check") != "resume" || json_text(check, "status") != "fail" || !check.contains("command")) continue;
    command_block(box, fmt::format("The restart gate after step {}, as the job ran it (a new process takes the checkpoint on):",
                                   check.value("at", 0)),
                  json_text(check, "command"));
  }
  if (first_failing >= 0) {
    const int every = recipe.is_object() ? recipe.value("checkpoint_every", 0) : 0;
    command_block(box, fmt::format("Replay from the first failing step {}, bit for bit against the receipt:", first_failing),
                  fmt::format("harness replay {} --from {}{}", shell_word(receipt), first_failing, pack));
    if (every > 0) {
      add(box, "p", fmt::format("The run saved checkpoints every {} steps: the replay resumes from the last one at or before step {}.",
                                every, first_failing), "muted");
    } else if (first_failing > 0) {
      add(box, "p", fmt::format("Replay resumes from a checkpoint, which this receipt lacks (the nightly runs without "
                                "--checkpoint-every): it recomputes steps 0 to {} first. For a long run, reproduce with "
                                "checkpoints and replay that receipt:", first_failing - 1), "muted");
      if (is_engine_recipe(recipe) || is_python_recipe(recipe)) {
        add(box, "pre",
            run_command(recipe, id + ".h5", first_failing, python) + "\nharness replay " + shell_word(id + ".h5") + " --from " +
                std::to_string(first_failing),
            "command");
      }
    } else {
      add(box, "p", "Step 0 fails: the replay starts from the initial state, no checkpoint needed (for a later step, "
                    "reproduce with --checkpoint-every K and replay that receipt).", "muted");
    }
  }
}

void lane_section(pugi::xml_node body, const json& lane, int steps, const json& common_stack, const json& summary) {
  pugi::xml_node section = add(body, "section", "", "lane");
  section.append_attribute("id") = ("lane-" + json_text(lane, "id")).c_str();
  section.append_attribute("data-status") = json_text(lane, "status").c_str();
  add(section, "h3", fmt::format("{} ({}): {}", json_text(lane, "lane"), json_text(lane, "id"), json_text(lane, "status")));
  if (!json_text(lane, "why").empty()) add(section, "p", json_text(lane, "why"), "muted");
  charts(section, lane, steps);
  if (lane["triage"].is_string()) add(section, "p", "BF16-first triage: " + lane["triage"].get<std::string>());
  for (const json& check : lane["checks"]) {
    pugi::xml_node details = add(section, "details");
    if (json_text(check, "status") != "pass") details.append_attribute("open") = "open";
    add(details, "summary", fmt::format("{} check: {}: {}", json_text(check, "check"), json_text(check, "status"), json_text(check, "summary")));
    add(details, "pre", check.contains("error") ? json_text(check["error"], "message") : json_text(check, "text"), "verdict");
  }
  reproduce(section, lane, summary);
  if (lane.contains("stack") && lane["stack"] != common_stack) {
    add(section, "p", "Stack lines of this lane that differ from the job's:");
    stack_table(section, lane["stack"], common_stack);
  }
}

// The stack lines (compiler, flags, libraries, host) as a table; only the lines that
// differ from `common` when it is given.
void stack_table(pugi::xml_node parent, const json& stack, const json& common) {
  pugi::xml_node table = add(parent, "table", "", "stack");
  for (const auto& [key, value] : stack.items()) {
    if (common.contains(key) && common[key] == value) continue;
    pugi::xml_node row = table.append_child("tr");
    add(row, "th", key);
    add(add(row, "td"), "code", value.is_string() ? value.get<std::string>() : value.dump());
  }
}

}  // namespace

std::string html_report(const json& summary) {
  const json& matrix = summary["matrix"];
  const std::string verdict = json_text(summary, "verdict");
  const int steps = matrix["steps"].get<int>();
  pugi::xml_document doc;
  pugi::xml_node html = doc.append_child("html");
  html.append_attribute("lang") = "en";
  pugi::xml_node head = add(html, "head");
  add(head, "meta").append_attribute("charset") = "utf-8";
  add(head, "title", fmt::format("canary nightly: {}", verdict));
  add(head, "style", "@STYLE@");
  pugi::xml_node body = add(html, "body");
  pugi::xml_node title = add(body, "h1", "Canary nightly: ");
  add(title, "span", verdict, verdict);
  double seconds = 0;
  for (const json& shard : summary["shards"]) seconds = std::max(seconds, shard.value("seconds", 0.0));
  add(body, "p", fmt::format("Canary {}, {} steps, {} lanes, reference lane {}. Matrix {} ({}); budgets {} ({}); goldens {}. "
                             "{} shard(s), started {}, longest shard {:.1f} s.",
                             json_text(matrix, "canary"), steps, summary["lanes"].size(), json_text(matrix, "reference"),
                             json_text(matrix, "path"), json_text(matrix, "content_hash"), json_text(summary["budgets"], "path"),
                             json_text(summary["budgets"], "content_hash"), json_text(summary, "goldens"),
                             summary["shards"].size(), json_text(summary["shards"][0], "started_utc"), seconds),
      "muted");
  add(body, "h2", "Verdicts");
  if (const json estimate = summary.value("false_alarm", json(nullptr)); estimate.is_object()) {
    add(body, "p", json_text(estimate, "summary"), "false-alarm");  // docs/budgets.md, "False alarms"
  }
  verdict_table(body, summary);
  controls_table(body, summary.value("controls", json::array()));
  drift_section(body, summary.value("environment_drift", json(nullptr)));
  history_section(body, summary);
  const json stack = common_stack(summary);
  add(body, "h2", "Stack");
  stack_table(body, stack, json::object());
  add(body, "h2", "Lanes");
  for (const json& lane : summary["lanes"]) lane_section(body, lane, steps, stack, summary);
  add(body, "script", "@SCRIPT@");
  std::ostringstream out;
  doc.save(out, "  ", pugi::format_default | pugi::format_no_declaration | pugi::format_no_empty_element_tags);
  std::string page = "<!DOCTYPE html>\n" + out.str();
  page.replace(page.find("@STYLE@"), 7, kStyle);
  page.replace(page.rfind("@SCRIPT@"), 8, kScript);
  for (const char* void_end : {"</meta>", "</input>"}) {  // void elements take no end tag
    for (auto at = page.find(void_end); at != std::string::npos; at = page.find(void_end)) page.erase(at, std::strlen(void_end));
  }
  return page;
}

}  // namespace harness::nightly
