#include "budget_features.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::receipt {
namespace {

// Item `index` (from 0) of `names`, as `text` gave them: empty, twice or ill-formed is refused.
void check_name(const std::vector<std::string>& names, std::size_t index, const std::string& text) {
  const std::string& name = names[index];
  if (name.empty()) {
    throw std::invalid_argument(fmt::format(
        "'{}' has an empty feature name (item {}); give names joined with '+', or \"\" for none", text, index + 1));
  }
  if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(index), name) !=
      names.begin() + static_cast<std::ptrdiff_t>(index)) {
    throw std::invalid_argument(fmt::format("'{}' names feature '{}' twice", text, name));
  }
  if (!BudgetFeatures::is_name(name)) {
    throw std::invalid_argument(
        fmt::format("'{}': feature name '{}' is not letters, digits, '-' and '_'", text, name));
  }
}

}  // namespace

BudgetFeatures::BudgetFeatures(std::vector<std::string> names) : names_(std::move(names)) {
  const std::string text = to_string();
  for (std::size_t i = 0; i < names_.size(); ++i) check_name(names_, i, text);
}

BudgetFeatures BudgetFeatures::parse(const std::string& text) {
  std::vector<std::string> names;
  for (std::size_t start = 0; !text.empty();) {
    const std::size_t end = text.find('+', start);
    names.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return BudgetFeatures(std::move(names));
}

bool BudgetFeatures::is_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

std::string BudgetFeatures::to_string() const { return fmt::format("{}", fmt::join(names_, "+")); }

bool BudgetFeatures::contains(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

}  // namespace harness::receipt
