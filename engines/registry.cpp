#include "registry.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "accel/accel_engine.h"
#include "cpu-ref/cpu_ref_engine.h"
#include "tpu-mesh/tpu_mesh_engine.h"

namespace harness {
namespace {

// One row per engine: its name, its flags and how to make it from settings it has checked
// (each engine refuses --features it does not take, in its own words). The rules below read
// the rows, never an engine's name.
struct EngineRow {
  std::string_view name;
  std::vector<EngineFlag> (*flags)();
  std::unique_ptr<Engine> (*make)(const EngineSettings&);
  ReceiptEntries (*receipt)();  // what it adds to a receipt beside the core
};

ReceiptEntries nothing_added() { return {}; }

std::unique_ptr<Engine> make_cpu_ref(const EngineSettings& settings) {
  if (!settings.features.empty()) {
    throw std::invalid_argument(
        fmt::format("--features: engine 'cpu-ref' takes no features (got '{}'); bf16/fp8 run on --engine accel or "
                    "--engine tpu-mesh --precision bf16",
                    settings.features));
  }
  return std::make_unique<CpuRefEngine>(parse_cpu_ref_config(settings));
}

std::unique_ptr<Engine> make_accel(const EngineSettings& settings) {
  return std::make_unique<accel::AccelEngine>(accel::parse_accel_config(settings));
}

std::unique_ptr<Engine> make_tpu_mesh(const EngineSettings& settings) {
  return std::make_unique<tpu::TpuMeshEngine>(tpu::parse_mesh_config(settings));
}

constexpr EngineRow kEngines[] = {
    {"cpu-ref", cpu_ref_flags, make_cpu_ref, nothing_added},
    {"accel", accel::accel_flags, make_accel, accel::accel_receipt_entries},
    {"tpu-mesh", tpu::mesh_flags, make_tpu_mesh, tpu::mesh_receipt_entries},
};

// Options `row`'s engine does not take: one line naming the flag and, when another engine
// takes it, that engine.
void reject_foreign_options(const EngineRow& row, const EngineSettings& settings) {
  for (const auto& [name, value] : settings.options) {
    const DescribedFlag* flag = find_engine_flag(name);
    if (flag != nullptr && flag->engine == row.name) continue;
    const std::string owner = flag == nullptr ? "" : fmt::format("; it belongs to --engine {}", flag->engine);
    if (row.flags().empty()) {
      throw std::invalid_argument(fmt::format("--{}: engine '{}' has no such setting{}", name, row.name, owner));
    }
    throw std::invalid_argument(fmt::format("--{}: not an option of engine {}{}", name, row.name, owner));
  }
}

}  // namespace

std::vector<std::string> engine_names() {
  std::vector<std::string> names;
  for (const EngineRow& row : kEngines) names.emplace_back(row.name);
  return names;
}

ReceiptEntries engine_receipt_entries() {
  ReceiptEntries entries;
  for (const EngineRow& row : kEngines) entries.append(row.receipt());
  return entries;
}

std::vector<DescribedFlag> engine_flags() {
  std::vector<DescribedFlag> flags;
  for (const EngineRow& row : kEngines) {
    for (const EngineFlag& f : row.flags()) flags.push_back({std::string(row.name), f});
  }
  return flags;
}

const DescribedFlag* find_engine_flag(std::string_view name) {
  static const std::vector<DescribedFlag> flags = engine_flags();
  for (const DescribedFlag& f : flags) {
    if (f.flag.name == name) return &f;
  }
  return nullptr;
}

std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings) {
  const auto row = std::find_if(std::begin(kEngines), std::end(kEngines), [&](const EngineRow& r) { return r.name == name; });
  if (row == std::end(kEngines)) {
    throw std::invalid_argument(fmt::format("--engine: unknown engine '{}' (available: {})", name,
                                            fmt::join(engine_names(), ", ")));
  }
  reject_foreign_options(*row, settings);
  return row->make(settings);
}

}  // namespace harness
