// JSON as the harness prints and logs it. Strings from outside (a file name, a receipt
// written by another stack) may hold bytes that are not UTF-8; nlohmann::json refuses to
// serialise those and the command would end on a library exception naming nothing, so
// they are written as U+FFFD instead: the output stays valid JSON and says where it was.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace harness::run {

// indent -1: one line (logs); 2: what the --json flags print.
inline std::string json_text(const nlohmann::json& j, int indent = 2) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace harness::run
