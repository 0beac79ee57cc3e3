// The nightly job: run every lane of a matrix (or one shard of it), check each receipt
// against its golden and against the reference lane, and summarise it all as one JSON
// document that the reports are rendered from (docs/nightly.md has its keys).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "budgets.h"
#include "matrix.h"
#include "verdict.h"

namespace harness::nightly {

inline constexpr int kSummarySchemaVersion = 1;

struct NightlyOptions {
  std::string matrix_path, budgets_path, goldens_dir, out_dir;
  Shard shard;
  std::string lanes;  // --lanes: a comma-separated selection of lane ids or names ("" : every lane)
  int threads = 0;  // per run; 0: all cores
};

// Where the job is, for a progress line: lane `lane_index` of `lane_count`, its step.
struct NightlyProgress {
  int lane_index = 0, lane_count = 0;
  std::string lane_id;
  int step = 0, steps = 0;
  double elapsed_seconds = 0, eta_seconds = 0;
  std::string finished_line;  // set once per lane, when it has been run and checked
};

class NightlyJob {
 public:
  // Loads and validates the matrix and the budgets; throws MatrixError or
  // check::BudgetError before anything is written.
  explicit NightlyJob(const NightlyOptions& options);
  ~NightlyJob();
  NightlyJob(const NightlyJob&) = delete;
  NightlyJob& operator=(const NightlyJob&) = delete;

  // Runs and checks the lanes and returns the summary; writes nothing but the receipts
  // under out_dir/receipts. A lane that cannot run or be checked is an error in the
  // summary, never an exception.
  nlohmann::json run(const std::function<void(const NightlyProgress&)>& progress);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// One check of `run` against `against` as the summary records it:
// {"check", "status": pass|fail|error, "against", "summary", "verdict"|"error"}.
nlohmann::json judge(const std::string& check, const check::ReceiptData& run, const check::ReceiptData& against,
                     const check::Budgets& budgets);

// Shards of one job into one summary; throws MatrixError naming the shard that does not
// fit (another matrix or budgets, a lane twice or missing).
nlohmann::json merge_summaries(const std::vector<nlohmann::json>& shards, const std::vector<std::string>& shard_dirs,
                               const std::string& out_dir);

// The exit status of a summary: 0 every check passed, 1 a regression, 2 an error.
int summary_exit_code(const nlohmann::json& summary);

}  // namespace harness::nightly
