// The HTML report: one self-contained page (no external resources), charts drawn as
// inline SVG here, a few lines of script for the "failures only" filter.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pugixml.hpp>

#include "reports.h"

namespace harness::nightly {
namespace {

using nlohmann::json;

// Style and script are raw text in HTML; they are spliced in after serialisation, where
// the XML writer cannot escape their characters.
constexpr const char* kStyle = R"(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d2430; max-width: 1200px; }
h1 .pass, td.pass { color: #137333; } h1 .fail, td.fail { color: #b3261e; } h1 .error, td.error { color: #a05a00; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #d5d9e0; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; }
section.lane { border-top: 1px solid #d5d9e0; margin-top: 24px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; } figcaption { font-size: 12px; color: #5f6b7a; }
.muted { color: #5f6b7a; }
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

// A line chart of several series over the steps, linear or log10 on y.
class Chart {
 public:
  Chart(int steps, bool log_y) : steps_(std::max(steps, 2)), log_y_(log_y) {}

  void series(const std::string& name, const json& values, const std::string& colour, bool dashed = false) {
    std::vector<double> v;
    for (const json& x : values) v.push_back(x.is_number() ? x.get<double>() : std::nan(""));
    lines_.push_back({name, colour, dashed, v});
  }

  void draw(pugi::xml_node parent, const std::string& caption) const {
    const auto [lo, hi] = y_range();
    pugi::xml_node figure = add(parent, "figure");
    pugi::xml_node svg = figure.append_child("svg");
    svg.append_attribute("xmlns") = "http://www.w3.org/2000/svg";
    svg.append_attribute("width") = kWidth;
    svg.append_attribute("height") = kHeight;
    svg.append_attribute("role") = "img";
    frame(svg, lo, hi);
    for (std::size_t i = 0; i < lines_.size(); ++i) polyline(svg, lines_[i], lo, hi, static_cast<int>(i));
    add(figure, "figcaption", caption);
  }

 private:
  static constexpr int kWidth = 540, kHeight = 250, kLeft = 64, kRight = 12, kTop = 24, kBottom = 30;
  struct Line {
    std::string name, colour;
    bool dashed;
    std::vector<double> values;
  };

  double y_of(double v) const { return log_y_ ? std::log10(v) : v; }

  std::pair<double, double> y_range() const {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const Line& l : lines_) {
      for (double v : l.values) {
        if (!std::isfinite(v) || (log_y_ && v <= 0)) continue;
        lo = std::min(lo, y_of(v));
        hi = std::max(hi, y_of(v));
      }
    }
    if (!std::isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
    return {lo, hi};
  }

  double px(int step) const { return kLeft + (kWidth - kLeft - kRight) * step / double(steps_ - 1); }
  double py(double y, double lo, double hi) const { return kTop + (kHeight - kTop - kBottom) * (1 - (y - lo) / (hi - lo)); }

  void frame(pugi::xml_node svg, double lo, double hi) const {
    pugi::xml_node box = svg.append_child("rect");
    box.append_attribute("x") = kLeft;
    box.append_attribute("y") = kTop;
    box.append_attribute("width") = kWidth - kLeft - kRight;
    box.append_attribute("height") = kHeight - kTop - kBottom;
    box.append_attribute("fill") = "none";
    box.append_attribute("stroke") = "#c4cad3";
    for (int i = 0; i <= 4; ++i) {
      const double y = lo + (hi - lo) * i / 4;
      label(svg, kLeft - 6, py(y, lo, hi) + 4, log_y_ ? fmt::format("1e{:.1f}", y) : fmt::format("{:.4g}", y), "end");
    }
    label(svg, px(0), kHeight - 10, "0", "middle");
    label(svg, px(steps_ - 1), kHeight - 10, std::to_string(steps_ - 1), "middle");
    label(svg, (kLeft + kWidth) / 2.0, kHeight - 10, "step", "middle");
  }

  static void label(pugi::xml_node svg, double x, double y, const std::string& text, const char* anchor) {
    pugi::xml_node t = svg.append_child("text");
    t.append_attribute("x") = x;
    t.append_attribute("y") = y;
    t.append_attribute("font-size") = 10;
    t.append_attribute("text-anchor") = anchor;
    t.text().set(text.c_str());
  }

  void polyline(pugi::xml_node svg, const Line& l, double lo, double hi, int index) const {
    std::string points;
    for (std::size_t s = 0; s < l.values.size(); ++s) {
      const double v = l.values[s];
      if (!std::isfinite(v)) continue;
      // Zero on a log scale (an exact step) sits on the bottom edge.
      const double y = log_y_ && v <= 0 ? lo : std::clamp(y_of(v), lo, hi);
      points += fmt::format("{:.1f},{:.1f} ", px(static_cast<int>(s)), py(y, lo, hi));
    }
    pugi::xml_node p = svg.append_child("polyline");
    p.append_attribute("points") = points.c_str();
    p.append_attribute("fill") = "none";
    p.append_attribute("stroke") = l.colour.c_str();
    p.append_attribute("stroke-width") = 1.5;
    if (l.dashed) p.append_attribute("stroke-dasharray") = "5 3";
    add(p, "title", l.name);
    pugi::xml_node key = svg.append_child("text");
    key.append_attribute("x") = kLeft + 150 * index;
    key.append_attribute("y") = kTop - 8;
    key.append_attribute("font-size") = 11;
    key.append_attribute("fill") = l.colour.c_str();
    key.text().set(l.name.c_str());
  }

  int steps_;
  bool log_y_;
  std::vector<Line> lines_;
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

void verdict_table(pugi::xml_node body, const json& summary) {
  pugi::xml_node filter = add(body, "label");
  pugi::xml_node box = filter.append_child("input");
  box.append_attribute("type") = "checkbox";
  box.append_attribute("id") = "failures-only";
  filter.append_child(pugi::node_pcdata).set_value(" failures and errors only");
  pugi::xml_node table = add(body, "table");
  table.append_attribute("id") = "verdicts";
  pugi::xml_node head = add(table, "thead").append_child("tr");
  for (const char* h : {"lane", "id", "status", "golden", "reference", "seconds"}) add(head, "th", h);
  pugi::xml_node rows = add(table, "tbody");
  for (const json& lane : summary["lanes"]) {
    const std::string status = json_text(lane, "status");
    pugi::xml_node row = rows.append_child("tr");
    row.append_attribute("data-status") = status.c_str();
    pugi::xml_node link = add(row, "td").append_child("a");
    link.append_attribute("href") = ("#lane-" + json_text(lane, "id")).c_str();
    add(link, "code", json_text(lane, "lane"));
    add(row, "td", json_text(lane, "id"));
    add(row, "td", status, status);
    add(row, "td", check_cell(lane, "golden"));
    add(row, "td", check_cell(lane, "reference"));
    add(row, "td", fmt::format("{:.1f}", lane.value("seconds", 0.0)));
  }
}

std::string budget_names(const json& envelope) {
  return fmt::format("{}", fmt::join(envelope["budget"].get<std::vector<std::string>>(), " + "));
}

void charts(pugi::xml_node section, const json& lane, int steps) {
  const json& series = lane["series"];
  if (!series.contains("loss")) return;
  pugi::xml_node row = add(section, "div", "", "charts");
  Chart loss(steps, false);
  loss.series("this run", series["loss"], "#1f5fbf");
  if (series.contains("golden_loss")) loss.series("golden", series["golden_loss"], "#e08a00", true);
  if (series.contains("reference_loss")) loss.series("reference lane", series["reference_loss"], "#6b7480", true);
  loss.draw(row, "Loss per step: this run, its golden and the reference lane.");
  if (!series.contains("envelope")) return;
  const json& envelope = series["envelope"];
  const bool exact = std::all_of(envelope["loss_deviation"].begin(), envelope["loss_deviation"].end(),
                                 [](const json& d) { return d.is_number() && d.get<double>() == 0; });
  const std::string against = json_text(envelope, "against");
  if (exact) {
    add(row, "p", fmt::format("Loss equal to {} at every step (budget: {}).", against, budget_names(envelope)), "muted");
    return;
  }
  Chart divergence(steps, true);
  divergence.series("|loss - " + against + "|", envelope["loss_deviation"], "#b3261e");
  divergence.series("budget envelope", envelope["loss_allowed"], "#137333", true);
  divergence.draw(row, fmt::format("Divergence from {} against the budget envelope ({}), log scale.", against,
                                   budget_names(envelope)));
}

void lane_section(pugi::xml_node body, const json& lane, int steps, const json& common_stack) {
  pugi::xml_node section = add(body, "section", "", "lane");
  section.append_attribute("id") = ("lane-" + json_text(lane, "id")).c_str();
  add(section, "h3", fmt::format("{} ({}): {}", json_text(lane, "lane"), json_text(lane, "id"), json_text(lane, "status")));
  if (!json_text(lane, "why").empty()) add(section, "p", json_text(lane, "why"), "muted");
  charts(section, lane, steps);
  if (lane["triage"].is_string()) add(section, "p", "BF16-first triage: " + lane["triage"].get<std::string>());
  for (const json& check : lane["checks"]) {
    pugi::xml_node details = add(section, "details");
    if (json_text(check, "status") != "pass") details.append_attribute("open") = "open";
    add(details, "summary", fmt::format("{} check: {}: {}", json_text(check, "check"), json_text(check, "status"), json_text(check, "summary")));
    add(details, "pre", check.contains("error") ? json_text(check["error"], "message") : json_text(check, "text"));
  }
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
  verdict_table(body, summary);
  const json stack = common_stack(summary);
  add(body, "h2", "Stack");
  stack_table(body, stack, json::object());
  add(body, "h2", "Lanes");
  for (const json& lane : summary["lanes"]) lane_section(body, lane, steps, stack);
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
