#include "fault.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::canary {
namespace {

constexpr std::array<std::pair<FaultKind, std::string_view>, 5> kKindNames{{{FaultKind::kNudge, "nudge"},
                                                                            {FaultKind::kWeightScale, "weight-scale"},
                                                                            {FaultKind::kWeightUlps, "weight-ulps"},
                                                                            {FaultKind::kLrScale, "lr-scale"},
                                                                            {FaultKind::kEpsScale, "eps-scale"}}};

// The keys each kind needs, then the ones it may take: anything else is an error.
struct KindKeys {
  std::vector<std::string_view> needed, optional;
};
// "step, op, ulps": every key the kind takes.
std::string keys_text(const KindKeys& keys) {
  std::vector<std::string_view> all = keys.needed;
  all.insert(all.end(), keys.optional.begin(), keys.optional.end());
  return fmt::format("{}", fmt::join(all, ", "));
}

bool takes(const KindKeys& keys, std::string_view key) {
  return std::find(keys.needed.begin(), keys.needed.end(), key) != keys.needed.end() ||
         std::find(keys.optional.begin(), keys.optional.end(), key) != keys.optional.end();
}

KindKeys keys_of(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNudge: return {{"step", "op"}, {"ulps"}};
    case FaultKind::kWeightScale: return {{"step", "tensor", "by"}, {}};
    case FaultKind::kWeightUlps: return {{"tensor", "ulps"}, {}};
    case FaultKind::kLrScale: return {{"step", "by"}, {}};
    case FaultKind::kEpsScale: return {{"by"}, {}};
  }
  return {};
}

template <typename Int>
Int parse_int(std::string_view key, std::string_view value, Int min_value) {
  Int out{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || out < min_value) {
    throw std::invalid_argument(fmt::format("--inject-fault: {}='{}' is not an integer >= {}", key, value, min_value));
  }
  return out;
}

double parse_by(std::string_view value, FaultKind kind) {
  double out = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  const bool factor = kind == FaultKind::kEpsScale;  // a factor, else a relative change
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(out) || (factor ? out <= 0 : out <= -1) ||
      (!factor && out == 0)) {
    throw std::invalid_argument(fmt::format("--inject-fault: by='{}' is not {}", value,
                                            factor ? "a factor > 0" : "a relative change E > -1, E != 0 (times 1 + E)"));
  }
  return out;
}

FaultKind parse_kind(std::string_view value) {
  for (const auto& [kind, name] : kKindNames) {
    if (name == value) return kind;
  }
  std::vector<std::string_view> names;
  for (const auto& entry : kKindNames) names.push_back(entry.second);
  throw std::invalid_argument(fmt::format("--inject-fault: kind='{}' is not a fault kind ({})", value, fmt::join(names, ", ")));
}

// The fields as key -> value, in any order, each once.
std::map<std::string, std::string, std::less<>> split_fields(std::string_view text) {
  std::map<std::string, std::string, std::less<>> fields;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view field = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const auto eq = field.find('=');
    if (eq == std::string_view::npos) {
      throw std::invalid_argument(
          fmt::format("--inject-fault: field '{}' is not key=value (want step=K,op=NAME[,ulps=N] or kind=...)", field));
    }
    if (!fields.emplace(std::string(field.substr(0, eq)), std::string(field.substr(eq + 1))).second) {
      throw std::invalid_argument(fmt::format("--inject-fault: {} given twice", field.substr(0, eq)));
    }
  }
  return fields;
}

void require_known(std::string_view what, const std::string& name, const std::vector<std::string>& known) {
  if (std::find(known.begin(), known.end(), name) != known.end()) return;
  if (known.size() < 3) throw std::invalid_argument(fmt::format("--inject-fault: unknown {} '{}'", what, name));
  throw std::invalid_argument(fmt::format("--inject-fault: unknown {} '{}' (e.g. {}, {}, {}; see docs/canary.md)", what, name,
                                          known.at(1), known.at(2), known.at(known.size() - 1)));
}

}  // namespace

std::string_view fault_kind_name(FaultKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::string FaultSpec::to_string() const {
  switch (kind) {
    case FaultKind::kNudge: return fmt::format("step={},op={},ulps={}", step, op, ulps);
    case FaultKind::kWeightScale: return fmt::format("kind=weight-scale,step={},tensor={},by={}", step, tensor, by);
    case FaultKind::kWeightUlps: return fmt::format("kind=weight-ulps,tensor={},ulps={}", tensor, ulps);
    case FaultKind::kLrScale: return fmt::format("kind=lr-scale,step={},by={}", step, by);
    case FaultKind::kEpsScale: return fmt::format("kind=eps-scale,by={}", by);
  }
  return "";
}

FaultSpec parse_fault_spec(std::string_view text, const std::vector<std::string>& known_ops,
                           const std::vector<std::string>& known_parameters) {
  auto fields = split_fields(text);
  FaultSpec spec;
  if (const auto kind = fields.find("kind"); kind != fields.end()) {
    spec.kind = parse_kind(kind->second);
    fields.erase(kind);
  }
  const KindKeys keys = keys_of(spec.kind);
  for (const auto& [key, value] : fields) {
    if (!takes(keys, key)) {
      throw std::invalid_argument(fmt::format("--inject-fault: unknown key '{}' for {} (known: {})", key,
                                              fault_kind_name(spec.kind), keys_text(keys)));
    }
    if (key == "step") spec.step = parse_int<int>(key, value, 0);
    if (key == "op") spec.op = value;
    if (key == "tensor") spec.tensor = value;
    if (key == "ulps") spec.ulps = parse_int<std::int32_t>(key, value, 1);
    if (key == "by") spec.by = parse_by(value, spec.kind);
  }
  for (const std::string_view key : keys.needed) {
    if (!fields.count(key)) {
      throw std::invalid_argument(fmt::format("--inject-fault: {} needs {}=... (it takes {})", fault_kind_name(spec.kind),
                                              key, keys_text(keys)));
    }
  }
  if (spec.kind == FaultKind::kNudge) require_known("op", spec.op, known_ops);
  if (!spec.tensor.empty()) require_known("parameter", spec.tensor, known_parameters);
  return spec;
}

}  // namespace harness::canary
