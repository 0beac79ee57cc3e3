// Environment drift (docs/nightly.md, "Environment drift"): when several lanes fail their
// goldens and their stack lines moved from the goldens', which moved entry groups with the
// failing lanes, the reruns that set a lane's entry back to the golden's value where a
// rerun can, and the one whole-matrix refresh that would make the new stack the goldens'.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace harness::nightly {

// The manifest keys that describe the stack a lane ran on (the reports show them); all but
// git_commit, the code itself, are its environment.
inline constexpr const char* kStackKeys[] = {"git_commit", "toolchain", "libraries", "kernels",
                                             "host",       "cpu",       "threads"};
inline constexpr std::string_view kCodeKey = "git_commit";

// One stack line as entries "<key>.<name>" -> value. A line is a list of parts joined by
// "; ": "name version" parts ("fmt 9.1.0" -> libraries.fmt = 9.1.0), "label: value" parts
// (toolchain.flags), and parts of NAME=VALUE words, each its own entry (kernels.gemm; under
// a label, toolchain.numerics env.XLA_FLAGS). A line of one part that is neither is one
// value (cpu, host, threads).
std::map<std::string, std::string> stack_entries(std::string_view key, std::string_view line);

// The summary's `environment_drift` section, from its lanes' golden checks (their
// verdicts' stack_diff); null where fewer than two lanes fail their goldens or their
// stack lines did not move.
nlohmann::json environment_drift(const nlohmann::json& summary);

}  // namespace harness::nightly
