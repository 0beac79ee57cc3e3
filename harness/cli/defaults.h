// Default paths of the CLI: the budgets, matrix and goldens of the checkout this harness
// was built from (HARNESS_SOURCE_DIR), so that a fresh build checks against its own tree.
#pragma once

#include <string>

namespace harness::cli {

inline std::string default_budgets() { return std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml"; }
inline std::string default_matrix() { return std::string(HARNESS_SOURCE_DIR) + "/canaries/nightly.toml"; }
inline std::string default_goldens() { return std::string(HARNESS_SOURCE_DIR) + "/goldens"; }

}  // namespace harness::cli
