#include "host_variants.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "canary_run.h"
#include "kernels/gemm.h"
#include "matrix.h"
#include "numerics/isa_dispatch.h"

namespace harness::nightly {
namespace {

// An environment variable's name: letters, digits and '_', not starting with a digit.
bool variable_name(const std::string& name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name.front())) &&
         std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string preset_names() {
  std::vector<std::string> names;
  for (const HostVariant& v : host_variant_presets()) names.push_back(v.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// "VAR=VALUE+VAR=VALUE" as a variant named by its text.
HostVariant assignments(const std::string& item) {
  HostVariant v{item, {}, ""};
  for (const std::string& assignment : split_list(item, '+')) {
    const auto eq = assignment.find('=');
    const std::string name = assignment.substr(0, eq);
    if (eq == std::string::npos || !variable_name(name) || eq + 1 == assignment.size()) {
      throw run::UsageError(fmt::format("--hosts: '{}' is neither a preset ({}) nor VAR=VALUE[+VAR=VALUE...]", item,
                                        preset_names()));
    }
    if (!v.environment.emplace(name, assignment.substr(eq + 1)).second) {
      throw run::UsageError(fmt::format("--hosts: '{}' sets {} twice", item, name));
    }
  }
  return v;
}

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& w : split_list(text, ' ')) {
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

// A flag's name: a word's text up to its '=' ("--xla_cpu_max_isa"); "" for a word without one.
std::string flag_name(const std::string& word) {
  const auto eq = word.find('=');
  return eq == std::string::npos ? "" : word.substr(0, eq);
}

// The part of `variable`'s `value` that is a host's knob, "" for none: the whole value where
// the presets set the variable to one value, the flags they set where they set flags.
std::string knob_of(const std::string& variable, const std::string& value) {
  bool preset_sets_it = false;
  std::set<std::string> flags;
  for (const HostVariant& preset : host_variant_presets()) {
    const auto it = preset.environment.find(variable);
    if (it == preset.environment.end()) continue;
    preset_sets_it = true;
    for (const std::string& word : words(it->second)) {
      if (!flag_name(word).empty()) flags.insert(flag_name(word));
    }
  }
  if (!preset_sets_it) return "";
  if (flags.empty()) return value;
  std::vector<std::string> kept;
  for (const std::string& word : words(value)) {
    if (flags.count(flag_name(word))) kept.push_back(word);
  }
  return fmt::format("{}", fmt::join(kept, " "));
}

}  // namespace

const std::vector<HostVariant>& host_variant_presets() {
  static const std::vector<HostVariant> presets = {
      {"gemm-generic", {{kernels::kGemmKernelVariable, "generic"}},
       "the harness's portable GEMM kernel: a host without AVX2 and FMA"},
      {"gemm-avx2", {{kernels::kGemmKernelVariable, "avx2-fma"}}, "the harness's AVX2+FMA GEMM kernel: a host without AVX-512"},
      {"elementwise-sse", {{numerics::kElementwiseKernelVariable, "sse-4"}},
       "the harness's 4-wide element-wise loops: a host without AVX2"},
      {"aten-default", {{"ATEN_CPU_CAPABILITY", "default"}}, "PyTorch's ATen kernels without vector ISA"},
      {"aten-avx2", {{"ATEN_CPU_CAPABILITY", "avx2"}}, "PyTorch's ATen kernels for AVX2: a host without AVX-512"},
      {"aten-avx512", {{"ATEN_CPU_CAPABILITY", "avx512"}}, "PyTorch's ATen kernels for AVX-512 (where the CPU has it)"},
      {"onednn-sse41", {{"ONEDNN_MAX_CPU_ISA", "SSE41"}}, "oneDNN's kernels up to SSE4.1"},
      {"onednn-avx2", {{"ONEDNN_MAX_CPU_ISA", "AVX2"}}, "oneDNN's kernels up to AVX2"},
      {"onednn-avx512", {{"ONEDNN_MAX_CPU_ISA", "AVX512_CORE"}}, "oneDNN's kernels up to AVX-512 (where the CPU has it)"},
      // The fp32 GEMM of a real stack is its BLAS's: MKL in the torch wheels, OpenBLAS in
      // Debian's torch. Each picks its kernels from the CPU; these pin another CPU's branch.
      {"mkl-compatible", {{"MKL_CBWR", "COMPATIBLE"}}, "MKL's kernels for any x86 CPU (torch wheels' fp32 GEMM)"},
      {"mkl-avx2", {{"MKL_CBWR", "AVX2"}}, "MKL's AVX2 kernels: a host without AVX-512"},
      {"mkl-avx512", {{"MKL_CBWR", "AVX512"}}, "MKL's AVX-512 kernels (where the CPU has it)"},
      {"openblas-prescott", {{"OPENBLAS_CORETYPE", "Prescott"}}, "OpenBLAS's SSE3 kernels (Debian's torch's fp32 GEMM)"},
      {"openblas-sandybridge", {{"OPENBLAS_CORETYPE", "Sandybridge"}}, "OpenBLAS's AVX kernels: a host without AVX2"},
      {"openblas-haswell", {{"OPENBLAS_CORETYPE", "Haswell"}}, "OpenBLAS's AVX2 kernels"},
      // XLA's CPU client (JAX, torch_xla) compiles its loops for the host's ISA through LLVM;
      // this caps it (the whole XLA_FLAGS: a lane's own flags are appended by the lane).
      {"xla-sse42", {{"XLA_FLAGS", "--xla_cpu_max_isa=SSE4_2"}}, "XLA's CPU code without AVX: a host without AVX2 and FMA"},
      {"xla-avx2", {{"XLA_FLAGS", "--xla_cpu_max_isa=AVX2"}}, "XLA's CPU code up to AVX2: a host without AVX-512"},
      {"xla-avx512", {{"XLA_FLAGS", "--xla_cpu_max_isa=AVX512"}}, "XLA's CPU code up to AVX-512 (where the CPU has it)"},
  };
  return presets;
}

std::vector<HostVariant> parse_host_variants(const std::string& text) {
  std::vector<HostVariant> variants;
  std::set<std::string> seen;
  for (const std::string& item : split_list(text)) {
    if (item.empty()) {
      throw run::UsageError(fmt::format("--hosts: '{}' has an empty item; give presets ({}) or VAR=VALUE", text, preset_names()));
    }
    if (!seen.insert(item).second) throw run::UsageError(fmt::format("--hosts: {} is given twice", item));
    const auto& presets = host_variant_presets();
    const auto preset = std::find_if(presets.begin(), presets.end(), [&](const HostVariant& v) { return v.name == item; });
    variants.push_back(preset != presets.end() ? *preset : assignments(item));
  }
  return variants;
}

std::string host_variant_of(const std::map<std::string, std::string>& environment) {
  std::map<std::string, std::string> knobs;
  for (const auto& [variable, value] : environment) {
    if (std::string knob = knob_of(variable, value); !knob.empty()) knobs.emplace(variable, std::move(knob));
  }
  if (knobs.empty()) return "";
  for (const HostVariant& preset : host_variant_presets()) {
    if (preset.environment == knobs) return preset.name;
  }
  std::vector<std::string> assignments;
  for (const auto& [variable, knob] : knobs) assignments.push_back(variable + "=" + knob);
  return fmt::format("{}", fmt::join(assignments, "+"));
}

}  // namespace harness::nightly
