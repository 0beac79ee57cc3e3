#include "lane_run.h"

#include <filesystem>

namespace harness::nightly {

run::RunSummary run_lane(const Matrix& matrix, const LaneSpec& spec, const std::string& out,
                         const std::function<void(const run::StepProgress&)>& on_step, int threads) {
  const std::string partial = out + ".partial";
  run::RunOptions options = matrix.run_options(spec, partial);
  options.force = true;
  options.threads = threads;
  try {
    run::RunSummary summary = run::run_canary(options, on_step);
    std::filesystem::rename(partial, out);
    summary.receipt_path = out;
    return summary;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

}  // namespace harness::nightly
