#include "stack_info.h"

#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>

#include <cereal/version.hpp>
#include <fmt/format.h>
#include <oneapi/tbb/version.h>
#include <xxhash.h>

#include "kernels/gemm.h"
#include "kernels/vector_lanes.h"
#include "numerics/isa_dispatch.h"
#include "harness_build_info.h"

namespace harness::run {
namespace {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

}  // namespace

StackInfo collect_stack_info() {
  StackInfo info;
  info.git_commit = HARNESS_GIT_COMMIT;
  info.toolchain = fmt::format("{}; flags: {}", HARNESS_COMPILER, HARNESS_BUILD_FLAGS);
  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
  const unsigned xxh = XXH_versionNumber();  // major*10000 + minor*100 + release
  info.libraries = fmt::format("HDF5 {}.{}.{}; oneTBB {}; xxHash {}.{}.{}; cereal {}.{}.{}; fmt {}.{}.{}", h5_major,
                               h5_minor, h5_release, TBB_runtime_version(), xxh / 10000, xxh / 100 % 100, xxh % 100,
                               CEREAL_VERSION_MAJOR, CEREAL_VERSION_MINOR, CEREAL_VERSION_PATCH, FMT_VERSION / 10000,
                               FMT_VERSION / 100 % 100, FMT_VERSION % 100);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  info.host = host;
  info.kernels = fmt::format("gemm={} elementwise={}", kernels::gemm_kernel_name(), kernels::lane_kernels().name);
  info.cpu = cpu_model();
  return info;
}

std::span<const StackSetting> stack_settings() {
  static constexpr StackSetting kSettings[] = {
      {"kernels.gemm", kernels::kGemmKernelVariable, ""},
      {"kernels.elementwise", numerics::kElementwiseKernelVariable, ""},
      {"threads", "", "--threads"},
  };
  return kSettings;
}

std::string utc_timestamp() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace harness::run
