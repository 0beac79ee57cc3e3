// Hosts emulated on one machine (docs/budgets.md, "Hosts"): the knobs that move a stack's
// bits from one host to another, set for a lane's run. A variant is a preset of this table
// (its name) or environment assignments given as they are (VAR=VALUE[+VAR=VALUE...]).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace harness::nightly {

struct HostVariant {
  std::string name;  // the preset's name, or the assignments as given
  std::map<std::string, std::string> environment;
  std::string what;  // the host it stands for ("" for assignments given as they are)
};

// The presets: the harness's own kernel choices and PyTorch's (ATen's, oneDNN's) CPU ISA.
const std::vector<HostVariant>& host_variant_presets();

// --hosts: comma-separated presets or assignments, each once. Throws run::UsageError naming
// the item and listing the presets.
std::vector<HostVariant> parse_host_variants(const std::string& text);

}  // namespace harness::nightly
