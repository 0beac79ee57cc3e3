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

// A JSON library error as a person reads it: what() without its "[json.exception.<kind>.<id>] "
// prefix, which names the library's internals, not the file ("key 'lane' not found",
// "type must be string, but is number", "syntax error while parsing value ...").
inline std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const std::size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

}  // namespace harness::run
