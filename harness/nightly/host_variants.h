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

// The emulated host a run's environment stands for ("" where it stands for none): of its
// variables, only those a preset sets are a host's knobs (a lane's own PJRT_DEVICE is not),
// and of a flags value only the flags a preset sets (XLA_FLAGS' --xla_cpu_max_isa, not the
// JAX lane's own device count). The preset's name where the knobs are exactly a preset's,
// else the assignments as --hosts takes them (VAR=VALUE+VAR=VALUE, by variable).
std::string host_variant_of(const std::map<std::string, std::string>& environment);

}  // namespace harness::nightly
