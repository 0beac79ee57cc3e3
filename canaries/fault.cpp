#include "fault.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

namespace harness::canary {
namespace {

template <typename Int>
Int parse_int(std::string_view key, std::string_view value, Int min_value) {
  Int out{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || out < min_value) {
    throw std::invalid_argument(fmt::format("--inject-fault: {}='{}' is not an integer >= {}", key, value, min_value));
  }
  return out;
}

}  // namespace

std::string FaultSpec::to_string() const { return fmt::format("step={},op={},ulps={}", step, op, ulps); }

FaultSpec parse_fault_spec(std::string_view text, const std::vector<std::string>& known_ops) {
  FaultSpec spec;
  bool has_step = false, has_op = false;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view field = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const auto eq = field.find('=');
    if (eq == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("--inject-fault: field '{}' is not key=value (want step=K,op=NAME[,ulps=N])", field));
    }
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "step") {
      spec.step = parse_int<int>(key, value, 0);
      has_step = true;
    } else if (key == "op") {
      spec.op = std::string(value);
      has_op = true;
    } else if (key == "ulps") {
      spec.ulps = parse_int<std::int32_t>(key, value, 1);
    } else {
      throw std::invalid_argument(fmt::format("--inject-fault: unknown key '{}' (known: step, op, ulps)", key));
    }
  }
  if (!has_step || !has_op) throw std::invalid_argument("--inject-fault: needs both step=K and op=NAME");
  if (std::find(known_ops.begin(), known_ops.end(), spec.op) == known_ops.end()) {
    throw std::invalid_argument(fmt::format("--inject-fault: unknown op '{}' (e.g. {}, {}, {}; see docs/canary.md)", spec.op,
                                            known_ops.at(1), known_ops.at(2), known_ops.at(known_ops.size() - 1)));
  }
  return spec;
}

}  // namespace harness::canary
