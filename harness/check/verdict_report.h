// A verdict for people (a few aligned lines) and for machines (JSON, keys documented in
// docs/cli.md, "check and compare").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "verdict.h"

namespace harness::check {

inline constexpr int kVerdictJsonVersion = 1;

nlohmann::json to_json(const Verdict& verdict);
// The stack lines show what both sides have and differ in; settings only one side has are
// counted on one line, and listed in full with `verbose`.
std::string to_text(const Verdict& verdict, bool verbose = false);
// The verdict in one line: "FAIL loss: first failing step 1, worst step 2: |d| ... allowed,
// N step(s) over (M allowed)", or "pass (least headroom 31%: loss at step 8)".
std::string one_line(const Verdict& verdict);
// The judged metric with the least headroom (the most negative where the verdict fails);
// nullptr when no metric was judged.
const MetricVerdict* tightest_metric(const Verdict& verdict);
// The JSON of a comparison that could not be made (exit 2).
nlohmann::json error_json(const std::string& kind, const std::string& message);

}  // namespace harness::check
