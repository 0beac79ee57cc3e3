// Emulated hosts (harness/nightly/host_variants.h): the host a receipt's recorded
// environment stands for, which `calibrate --receipts` names in an entry's host_variants.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "budgets.h"
#include "host_variants.h"

namespace harness::nightly {
namespace {

TEST(HostVariantOf, EveryPresetIsNamedFromItsOwnEnvironmentBesideALanesOwnSettings) {
  for (const HostVariant& preset : host_variant_presets()) {
    EXPECT_EQ(host_variant_of(preset.environment), preset.name);
    std::map<std::string, std::string> lane = preset.environment;
    lane.emplace("PJRT_DEVICE", "CPU");  // torch_xla's client: the lane's, not the host's
    lane.emplace("OMP_NUM_THREADS", "1");
    // The JAX lane appends its device count to the host's XLA_FLAGS.
    if (auto flags = lane.find("XLA_FLAGS"); flags != lane.end()) flags->second += " --xla_force_host_platform_device_count=4";
    EXPECT_EQ(host_variant_of(lane), preset.name) << preset.name;
  }
}

TEST(HostVariantOf, ALanesOwnSettingsAloneAreNoHost) {
  EXPECT_EQ(host_variant_of({}), "");
  EXPECT_EQ(host_variant_of({{"PJRT_DEVICE", "CPU"}, {"XLA_FLAGS", "--xla_force_host_platform_device_count=2"}}), "");
}

TEST(HostVariantOf, KnobsOfSeveralPresetsAreAssignmentsThatHostsTakesBack) {
  const std::map<std::string, std::string> environment = {
      {"MKL_CBWR", "COMPATIBLE"}, {"OPENBLAS_CORETYPE", "Prescott"}, {"PJRT_DEVICE", "CPU"}};
  const std::string name = host_variant_of(environment);
  EXPECT_EQ(name, "MKL_CBWR=COMPATIBLE+OPENBLAS_CORETYPE=Prescott");
  const std::vector<HostVariant> parsed = parse_host_variants(name);
  ASSERT_EQ(parsed.size(), 1u);
  EXPECT_EQ(parsed.front().environment,
            (std::map<std::string, std::string>{{"MKL_CBWR", "COMPATIBLE"}, {"OPENBLAS_CORETYPE", "Prescott"}}));
  // A value no preset has is still a host's knob, named as it is.
  EXPECT_EQ(host_variant_of({{"ATEN_CPU_CAPABILITY", "zen"}}), "ATEN_CPU_CAPABILITY=zen");
  EXPECT_EQ(host_variant_of({{"XLA_FLAGS", "--xla_cpu_max_isa=AVX --xla_force_host_platform_device_count=2"}}),
            "XLA_FLAGS=--xla_cpu_max_isa=AVX");
}

// An entry that judges two receipts of different platforms (the target of some entry's
// across_platforms) was checked across hosts: it names at least two emulated hosts, each a
// --hosts item that runs again, and the real CPUs it ran on.
TEST(ShippedBudgets, EveryCrossPlatformEntryNamesTheHostsItWasCheckedAcross) {
  const check::Budgets budgets = check::load_budgets(std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml");
  std::vector<std::pair<std::string, const check::FeatureBudget*>> entries;  // (canary, entry)
  for (const auto& [name, entry] : budgets.features) entries.emplace_back("", &entry);
  for (const auto& [canary, group] : budgets.per_canary) {
    for (const auto& [name, entry] : group) entries.emplace_back(canary, &entry);
  }
  int cross_platform = 0;
  for (const auto& [canary, entry] : entries) {
    if (!entry->provenance.host_variants.empty()) {
      EXPECT_NO_THROW(parse_host_variants(fmt::format("{}", fmt::join(entry->provenance.host_variants, ","))))
          << entry->key();
    }
    if (entry->across_platforms.empty()) continue;
    const check::FeatureBudget* across = budgets.find(entry->across_platforms, canary);
    if (!across || across->bitwise) continue;  // judged bitwise, or not across platforms at all
    ++cross_platform;
    EXPECT_GE(across->provenance.host_variants.size(), 2u) << across->key() << " (across_platforms of " << entry->key() << ")";
    EXPECT_FALSE(across->provenance.host_cpus.empty()) << across->key();
  }
  EXPECT_GE(cross_platform, 5);
}

}  // namespace
}  // namespace harness::nightly
