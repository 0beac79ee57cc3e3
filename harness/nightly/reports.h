// The reports of a nightly summary (docs/nightly.md): for people (a self-contained HTML
// page, a Markdown summary for a pull-request comment) and for CI (JUnit XML, the JSON
// summary itself). All are rendered from the summary alone, so merged shards render the
// same way as one unsharded run.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace harness::nightly {

std::string html_report(const nlohmann::json& summary);
std::string junit_report(const nlohmann::json& summary);
std::string markdown_report(const nlohmann::json& summary);

// The string at `key` of a summary object, or `fallback` (reports render what is there).
std::string json_text(const nlohmann::json& object, const char* key, const std::string& fallback = "");

// Writes summary.json, report.html, junit.xml and summary.md into `out_dir`, each whole
// or not at all. Returns the paths written, in that order.
std::vector<std::string> write_reports(const nlohmann::json& summary, const std::string& out_dir);

}  // namespace harness::nightly
