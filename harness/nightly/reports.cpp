#include "reports.h"

#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "file_io.h"

namespace harness::nightly {
namespace {

using nlohmann::json;

std::string text_of(const json& j, const char* key, const std::string& fallback = "") {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// The message a failed or errored check gives CI.
std::string check_message(const json& check) {
  if (check.contains("error")) return fmt::format("{}: {}", text_of(check["error"], "kind"), text_of(check["error"], "message"));
  return text_of(check, "summary");
}

std::string markdown_cell(std::string text) {
  for (std::size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) text.replace(at, 1, "\\|");
  return text;
}

std::string status_mark(const std::string& status) {
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
    suite.append_attribute("name") = text_of(lane, "lane").c_str();
    int suite_failures = 0, suite_errors = 0;
    for (const json& check : lane["checks"]) {
      pugi::xml_node test = suite.append_child("testcase");
      test.append_attribute("classname") = fmt::format("nightly.{}", text_of(lane, "id")).c_str();
      test.append_attribute("name") = text_of(check, "check").c_str();
      const std::string status = text_of(check, "status");
      if (status != "pass") {
        pugi::xml_node problem = test.append_child(status == "fail" ? "failure" : "error");
        problem.append_attribute("message") = check_message(check).c_str();
        problem.append_attribute("type") = status == "fail" ? "regression" : text_of(check.value("error", json::object()), "kind").c_str();
        problem.text().set(text_of(check, "text", check_message(check)).c_str());
        (status == "fail" ? suite_failures : suite_errors)++;
      }
      if (check.contains("text")) test.append_child("system-out").text().set(text_of(check, "text").c_str());
    }
    suite.append_attribute("tests") = static_cast<int>(lane["checks"].size());
    suite.append_attribute("failures") = suite_failures;
    suite.append_attribute("errors") = suite_errors;
    suite.append_attribute("time") = lane.value("seconds", 0.0);
    tests += static_cast<int>(lane["checks"].size());
    failures += suite_failures;
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
                               status_mark(text_of(summary, "verdict")), text_of(matrix, "canary"),
                               matrix["steps"].get<int>(), summary["lanes"].size(), text_of(matrix, "path"),
                               text_of(summary["budgets"], "path"));
  md += "| lane | golden | reference | time |\n|---|---|---|---|\n";
  for (const json& lane : summary["lanes"]) {
    std::string golden = "—", reference = "—";
    for (const json& check : lane["checks"]) {
      const std::string cell = markdown_cell(fmt::format("{}: {}", status_mark(text_of(check, "status")), text_of(check, "summary")));
      (text_of(check, "check") == "reference" ? reference : golden) = cell;
    }
    md += fmt::format("| `{}` | {} | {} | {:.1f} s |\n", text_of(lane, "lane"), golden, reference, lane.value("seconds", 0.0));
  }
  for (const json& lane : summary["lanes"]) {
    if (text_of(lane, "status") == "pass") continue;
    md += fmt::format("\n<details><summary><code>{}</code>: {}</summary>\n\n", text_of(lane, "lane"), text_of(lane, "status"));
    for (const json& check : lane["checks"]) {
      if (text_of(check, "status") == "pass") continue;
      md += fmt::format("**{}**: {}\n\n```\n{}\n```\n\n", text_of(check, "check"), markdown_cell(check_message(check)),
                        text_of(check, "text", check_message(check)));
    }
    if (lane["triage"].is_string()) md += fmt::format("BF16-first triage: {}\n\n", lane["triage"].get<std::string>());
    md += "</details>\n";
  }
  return md;
}

std::vector<std::string> write_reports(const json& summary, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const std::vector<std::pair<std::string, std::string>> files{{"summary.json", summary.dump(2) + "\n"},
                                                               {"report.html", html_report(summary)},
                                                               {"junit.xml", junit_report(summary)},
                                                               {"summary.md", markdown_report(summary)}};
  std::vector<std::string> written;
  for (const auto& [name, text] : files) {
    const std::string path = (fs::path(out_dir) / name).string();
    write_file_atomically(path, text);
    written.push_back(path);
  }
  return written;
}

}  // namespace harness::nightly
