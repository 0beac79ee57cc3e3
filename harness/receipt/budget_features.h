// /manifest/budget_features (docs/budgets.md): the features that separate a run from the
// bitwise reference, each the name of a budget entry ([bf16], [torch-cpu]), each once, in
// the writer's order; written joined with '+', "" for none (the reference itself). The one
// parse and the one format of that attribute: writers, the validator, the verdict and the
// nightly matrix all go through it.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace harness::receipt {

class BudgetFeatures {
 public:
  BudgetFeatures() = default;  // none: the bitwise reference
  // Throws std::invalid_argument (one line, without a location: the caller names the
  // file and key) when a name is empty, given twice, or not a feature name.
  explicit BudgetFeatures(std::vector<std::string> names);
  static BudgetFeatures parse(const std::string& text);

  // A budget entry's name: letters, digits, '-' and '_' ('+' joins them).
  static bool is_name(const std::string& name);

  std::string to_string() const;  // '+'-joined, "" for none
  const std::vector<std::string>& names() const { return names_; }
  std::set<std::string> as_set() const { return {names_.begin(), names_.end()}; }
  bool contains(const std::string& name) const;
  bool empty() const { return names_.empty(); }

 private:
  std::vector<std::string> names_;
};

}  // namespace harness::receipt
