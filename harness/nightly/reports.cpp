#include "reports.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "file_io.h"
#include "json_text.h"

namespace harness::nightly {
namespace {

using nlohmann::json;

// The message a failed or errored check gives CI.
std::string check_message(const json& check) {
  if (check.contains("error")) return fmt::format("{}: {}", json_text(check["error"], "kind"), json_text(check["error"], "message"));
  return json_text(check, "summary");
}

// Table cells: one line, no column break, no HTML.
std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '<') out += "&lt;";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out;
}

// A fenced block that the text cannot close: a fence longer than any backtick run in it.
std::string code_block(const std::string& text) {
  std::size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(std::max<std::size_t>(3, longest + 1), '`');
  return fence + "\n" + text + (text.ends_with('\n') ? "" : "\n") + fence + "\n";
}

std::string status_mark(const std::string& status) {
  if (status == "warn") return "🔶 warn";  // a finding that passes (a bias check's default)
  return status == "pass" ? "✅ pass" : status == "fail" ? "❌ fail" : "⚠️ error";
}

}  // namespace

std::string junit_report(const json& summary) {
  pugi::xml_document doc;
  auto declaration = doc.append_child(pugi::node_declaration);
  declaration.append_attribute("version") = "1.0";
  declaration.append_attribute("encoding") = "UTF-8";
  pugi::xml_node suites = doc.append_child("testsuites");
  suites.append_attribute("name") = "harness nightly";
  int tests = 0, failures = 0, errors = 0;
  for (const json& lane : summary["lanes"]) {
    pugi::xml_node suite = suites.append_child("testsuite");
    suite.append_attribute("name") = json_text(lane, "lane").c_str();
    int suite_failures = 0, suite_errors = 0;
    for (const json& check : lane["checks"]) {
      pugi::xml_node test = suite.append_child("testcase");
      test.append_attribute("classname") = fmt::format("nightly.{}", json_text(lane, "id")).c_str();
      test.append_attribute("name") = json_text(check, "check").c_str();
      const std::string status = json_text(check, "status");
      if (status == "fail" || status == "error") {  // a warning passes: its text is in system-out
        pugi::xml_node problem = test.append_child(status == "fail" ? "failure" : "error");
        problem.append_attribute("message") = check_message(check).c_str();
        problem.append_attribute("type") = status == "fail" ? "regression" : json_text(check.value("error", json::object()), "kind").c_str();
        problem.text().set(json_text(check, "text", check_message(check)).c_str());
        (status == "fail" ? suite_failures : suite_errors)++;
      }
      if (check.contains("text")) test.append_child("system-out").text().set(json_text(check, "text").c_str());
    }
    suite.append_attribute("tests") = static_cast<int>(lane["checks"].size());
    suite.append_attribute("failures") = suite_failures;
    suite.append_attribute("errors") = suite_errors;
    suite.append_attribute("time") = lane.value("seconds", 0.0);
    tests += static_cast<int>(lane["checks"].size());
    failures += suite_failures;
    errors += suite_errors;
  }
  // The negative controls: a blind one (or one that could not run) is the job's error.
  const json controls = summary.value("controls", json::array());
  if (!controls.empty()) {
    pugi::xml_node suite = suites.append_child("testsuite");
    suite.append_attribute("name") = "negative controls";
    int suite_errors = 0;
    for (const json& control : controls) {
      pugi::xml_node test = suite.append_child("testcase");
      test.append_attribute("classname") = "nightly.controls";
      test.append_attribute("name") = json_text(control, "control").c_str();
      const std::string status = json_text(control, "status");
      if (status == "skipped") {
        test.append_child("skipped").append_attribute("message") = json_text(control, "summary").c_str();
      }
      if (status == "blind" || status == "error") {
        pugi::xml_node problem = test.append_child("error");
        problem.append_attribute("message") = json_text(control, "summary").c_str();
        problem.append_attribute("type") = status == "blind" ? "blind_control" : "control_error";
        ++suite_errors;
      }
    }
    suite.append_attribute("tests") = static_cast<int>(controls.size());
    suite.append_attribute("failures") = 0;
    suite.append_attribute("errors") = suite_errors;
    tests += static_cast<int>(controls.size());
    errors += suite_errors;
  }
  suites.append_attribute("tests") = tests;
  suites.append_attribute("failures") = failures;
  suites.append_attribute("errors") = errors;
  std::ostringstream out;
  doc.save(out, "  ");
  return out.str();
}

std::string markdown_report(const json& summary) {
  const json& matrix = summary["matrix"];
  std::string md = fmt::format("## Canary nightly: {}\n\n`{}` canary, {} steps, {} lanes (matrix `{}`, budgets `{}`)\n\n",
                               status_mark(json_text(summary, "verdict")), json_text(matrix, "canary"),
                               matrix["steps"].get<int>(), summary["lanes"].size(), json_text(matrix, "path"),
                               json_text(summary["budgets"], "path"));
  md += "| lane | golden | reference | time |\n|---|---|---|---|\n";
  for (const json& lane : summary["lanes"]) {
    std::string golden = "—", reference = "—";
    for (const json& check : lane["checks"]) {
      const std::string cell = markdown_cell(fmt::format("{}: {}", status_mark(json_text(check, "status")), json_text(check, "summary")));
      const std::string name = json_text(check, "check");
      if (name == "reference") reference = cell;
      if (name == "golden" || name == "run") golden = cell;
    }
    md += fmt::format("| `{}` | {} | {} | {:.1f} s |\n", json_text(lane, "lane"), golden, reference, lane.value("seconds", 0.0));
  }
  // The checks beside the table (`bias-repeats`, `resume-at`), a line each.
  const std::map<std::string, std::string> beside{{"bias", "One-sided drift"}, {"resume", "Restart gate"}};
  for (const json& lane : summary["lanes"]) {
    for (const json& check : lane["checks"]) {
      const auto title = beside.find(json_text(check, "check"));
      if (title == beside.end()) continue;
      md += fmt::format("\n{} of `{}`: {}: {}\n", title->second, json_text(lane, "lane"),
                        status_mark(json_text(check, "status")), markdown_cell(json_text(check, "summary")));
    }
  }
  for (const json& lane : summary["lanes"]) {
    if (json_text(lane, "status") == "pass") continue;
    md += fmt::format("\n<details><summary><code>{}</code>: {}</summary>\n\n", json_text(lane, "lane"), json_text(lane, "status"));
    for (const json& check : lane["checks"]) {
      if (json_text(check, "status") == "pass") continue;
      md += fmt::format("**{}**: {}\n\n{}\n", json_text(check, "check"), markdown_cell(check_message(check)),
                        code_block(json_text(check, "text", check_message(check))));
    }
    if (lane["triage"].is_string()) md += fmt::format("BF16-first triage: {}\n\n", markdown_cell(lane["triage"].get<std::string>()));
    md += "</details>\n";
  }
  if (const json estimate = summary.value("false_alarm", json(nullptr)); estimate.is_object()) {
    md += fmt::format("\n{}\n", markdown_cell(json_text(estimate, "summary")));
  }
  const json drift = summary.value("environment_drift", json(nullptr));
  if (drift.is_object()) {
    md += fmt::format("\n**{}**\n\n| stack entry | golden -> run | failing lanes | passing lanes |\n|---|---|---|---|\n",
                      markdown_cell(json_text(drift, "summary")));
    for (const json& entry : drift["entries"]) {
      md += fmt::format("| `{}` | {} | {} | {} |\n", json_text(entry, "entry"),
                        markdown_cell(fmt::format("{}", fmt::join(entry["moves"].get<std::vector<std::string>>(), "; "))),
                        entry["failing"].get<int>(), entry["passing"].get<int>());
    }
    std::string commands;
    for (const json& rerun : drift["reruns"]) commands += json_text(rerun, "command") + "\n";
    for (const json& line : drift["refresh"]) commands += line.get<std::string>() + "\n";
    md += '\n';
    md += code_block(commands);
  }
  const json controls = summary.value("controls", json::array());
  if (!controls.empty()) {
    md += "\n| negative control | status | what it showed |\n|---|---|---|\n";
    for (const json& control : controls) {
      md += fmt::format("| {} | {} | {} |\n", json_text(control, "control"), json_text(control, "status"),
                        markdown_cell(json_text(control, "summary")));
    }
  }
  return md;
}

std::string json_text(const json& object, const char* key, const std::string& fallback) {
  return object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : fallback;
}

std::vector<std::string> write_reports(const json& summary, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const std::vector<std::pair<std::string, std::string>> files{{"summary.json", run::json_text(summary) + "\n"},
                                                               {"report.html", html_report(summary)},
                                                               {"junit.xml", junit_report(summary)},
                                                               {"summary.md", markdown_report(summary)}};
  std::vector<std::string> written;
  for (const auto& [name, text] : files) {
    const std::string path = (fs::path(out_dir) / name).string();
    run::write_file_atomically(path, text);
    written.push_back(path);
  }
  return written;
}

}  // namespace harness::nightly
