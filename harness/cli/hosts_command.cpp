// `harness hosts [V,...]`: the emulated hosts (docs/budgets.md, "Hosts"), every preset or
// the variants given as `calibrate --hosts` reads them, one a line: its name, its
// environment assignments and the host it stands for, tab-separated. Scripts that run a
// stack under a host themselves (scripts/calibrate-layout.sh) read the assignments from here,
// so that the presets are written once.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "host_variants.h"

namespace harness::cli {

void add_hosts_command(CLI::App& app, CommandRegistry& commands) {
  auto text = std::make_shared<std::string>();
  CLI::App* hosts = app.add_subcommand(
      "hosts", "List the emulated hosts (calibrate --hosts): name, environment assignments, the host it stands for");
  hosts->add_option("variants", *text, "V,...: these variants (presets or VAR=VALUE[+VAR=VALUE...]) instead of every preset");
  commands.add(hosts, [text] {
    const std::vector<nightly::HostVariant> variants =
        text->empty() ? nightly::host_variant_presets() : nightly::parse_host_variants(*text);
    for (const nightly::HostVariant& v : variants) {
      std::vector<std::string> assignments;
      for (const auto& [name, value] : v.environment) assignments.push_back(name + "=" + value);
      fmt::print("{}\t{}\t{}\n", v.name, fmt::join(assignments, " "), v.what);
    }
    return kExitPass;
  });
}

}  // namespace harness::cli
