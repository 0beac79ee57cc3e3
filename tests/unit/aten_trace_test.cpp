// A golden's stored aten traces (/aten_trace, written by `golden refresh` of a Python
// canary; docs/bisect.md): they validate and read back a step at a time, rows that do not
// follow each other are named, and bisect reads them instead of replaying the golden,
// replaying only the other run (with aten traces, whatever module traces it holds).
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "bisect.h"
#include "budgets.h"
#include "receipt/aten_trace.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_validator.h"
#include "receipt_bits.h"
#include "run/full_receipt_schema.h"
#include "verdict.h"

namespace harness::check {
namespace {

using harness::testing::lane;
using harness::testing::scratch;

const std::string kShippedBudgets = std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml";

ReceiptData run_into(const std::string& tag, run::RunOptions options) {
  options.out = scratch().path(tag + ".h5");
  options.force = true;
  run::run_canary(options);
  return load_receipt(options.out);
}

// Step s's trace: 3 + s columns (a step's ops change between steps); column 2's hash moved
// by `salt`, as another run's would be.
receipt::AtenTraceStep step_trace(int s, std::uint64_t salt = 0) {
  receipt::AtenTraceStep t;
  for (int c = 0; c < 3 + s; ++c) {
    t.columns.push_back({c, c == 0 ? "<model>" : "hidden", -1, c < 2 ? "forward" : "optimizer", "aten.mul.Tensor",
                         c < 2 ? "activation" : "state"});
    t.sites.push_back(fmt::format("team.py:{}", 10 + c));
    t.hashes.push_back(static_cast<std::uint64_t>(1000 * s + c) + (c == 2 ? salt : 0));
    t.l2.push_back(c);
    for (int w = 0; w < receipt::kSketchWidth; ++w) t.projection.push_back(w);
  }
  return t;
}

std::vector<receipt::AtenTraceStep> traces(int steps) {
  std::vector<receipt::AtenTraceStep> out;
  for (int s = 0; s < steps; ++s) out.push_back(step_trace(s));
  return out;
}

// A replay that traces aten ops: step s's trace with column 2 moved; notes whom it replayed.
TraceProvider aten_replay(std::vector<std::string>& replayed) {
  return [&replayed](const ReceiptData& run, int step) {
    replayed.push_back(run.path);
    receipt::AtenTraceStep t = step_trace(step, 7);
    return OpTrace{t.columns, t.hashes, t.l2, t.projection, t.sites, kAtenLevel};
  };
}

// A golden of micro (4 steps) holding aten traces, and a run whose step 2 moved.
struct GoldenAndRun {
  ReceiptData golden, moved;
};
GoldenAndRun golden_and_run(const std::string& tag, run::TraceLevel moved_trace) {
  const std::string golden = run_into(tag + "_golden", lane("micro", 4, 2)).path;
  receipt::write_aten_traces(golden, traces(4));
  run::RunOptions faulty = lane("micro", 4, 2);
  faulty.inject_fault = "step=2,op=blocks.0.attn.proj,ulps=4096";
  faulty.trace = moved_trace;
  return {load_receipt(golden), run_into(tag + "_moved", faulty)};
}

TEST(BisectAtenTrace, StoredTracesValidateAndReadBackAStepAtATime) {
  const std::string path = run_into("stored", lane("micro", 3, 2)).path;
  receipt::write_aten_traces(path, traces(3));
  const receipt::ValidationReport report = receipt::validate_receipt(path, run::full_receipt_schema());
  EXPECT_TRUE(report.valid()) << (report.problems.empty() ? "" : report.problems.front());
  EXPECT_TRUE(report.unknown.empty()) << (report.unknown.empty() ? "" : report.unknown.front());
  const receipt::AtenTraceStep back = receipt::read_aten_trace_step(receipt::ReceiptReader(path), 2);
  const receipt::AtenTraceStep written = step_trace(2);
  EXPECT_EQ(back.columns, written.columns);
  EXPECT_EQ(back.sites, written.sites);
  EXPECT_EQ(back.hashes, written.hashes);
  EXPECT_EQ(back.projection, written.projection);
  EXPECT_TRUE(load_receipt(path).aten_trace);
}

TEST(BisectAtenTrace, TracesOfAnotherStepCountAreRefusedBeforeAnyIsWritten) {
  const std::string path = run_into("miscounted", lane("micro", 3, 2)).path;
  EXPECT_THROW(receipt::write_aten_traces(path, traces(2)), std::invalid_argument);
  EXPECT_FALSE(load_receipt(path).aten_trace);
}

TEST(BisectAtenTrace, RowsThatDoNotFollowTheLastStepsAreNamed) {
  const std::string path = run_into("overlapping", lane("micro", 3, 2)).path;
  receipt::write_aten_traces(path, traces(3));
  {
    const h5::Handle file = h5::open_file_for_update(path);
    const h5::Handle offset(H5Dopen2(file, receipt::paths::kAtenTraceOffset, H5P_DEFAULT), H5Dclose, "open offset");
    const std::int64_t moved[] = {0, 2, 7};  // step 1 starts inside step 0 (its 3 rows)
    ASSERT_GE(H5Dwrite(offset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, moved), 0);
  }
  const receipt::ValidationReport report = receipt::validate_receipt(path, run::full_receipt_schema());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0],
            "/aten_trace/offset: [1] is 2 with length 4: each step's rows start where the last step's end (3)");
}

// A length that runs past the rows (the largest int64: an offset plus it overflows) is named
// by the validator, and bisect reading such a trace keeps its step and says why no op.
TEST(BisectAtenTrace, ALengthPastTheRowsIsNamedAndBisectStillNamesTheStep) {
  const auto [golden, moved] = golden_and_run("past_the_rows", run::TraceLevel::kNone);
  {
    const h5::Handle file = h5::open_file_for_update(golden.path);
    const h5::Handle length(H5Dopen2(file, receipt::paths::kAtenTraceLength, H5P_DEFAULT), H5Dclose, "open length");
    const std::int64_t lengths[] = {3, 4, std::numeric_limits<std::int64_t>::max(), 6};
    ASSERT_GE(H5Dwrite(length, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, lengths), 0);
  }
  const receipt::ValidationReport report = receipt::validate_receipt(golden.path, run::full_receipt_schema());
  ASSERT_FALSE(report.problems.empty());
  EXPECT_NE(report.problems.back().find("/aten_trace/length: [2] is 9223372036854775807: past the"), std::string::npos)
      << report.problems.back();
  EXPECT_THROW(load_receipt(golden.path), std::exception);  // what `harness bisect` loads: refused, exit 2
  // Damaged after it was loaded (or read by a caller that does not validate): bisect still ends.
  std::vector<std::string> replayed;
  const Bisection b = bisect(moved, golden, load_budgets(kShippedBudgets), aten_replay(replayed));
  EXPECT_EQ(b.first_divergent_step, 2);
  EXPECT_FALSE(b.first_divergent_op.has_value());
  EXPECT_NE(b.no_op.find("the golden is damaged"), std::string::npos) << b.no_op;
}

TEST(BisectAtenTrace, BisectReadsTheGoldensTraceAndReplaysOnlyTheOtherRun) {
  const auto [golden, moved] = golden_and_run("only_other", run::TraceLevel::kNone);
  std::vector<std::string> replayed;
  const Bisection b = bisect(moved, golden, load_budgets(kShippedBudgets), aten_replay(replayed));
  EXPECT_EQ(b.first_divergent_step, 2);
  EXPECT_EQ(replayed, std::vector<std::string>{moved.path});
  EXPECT_EQ(b.op_source, "replay of A and the aten trace B holds (recorded at golden refresh)");
  ASSERT_TRUE(b.first_divergent_op.has_value()) << b.no_op;
  EXPECT_EQ(b.first_divergent_op->index, 2);
  EXPECT_EQ(b.first_divergent_op->site, "team.py:12");
}

// Module op traces (/trace) do not compare with aten traces: the run is replayed with aten
// traces; without replays bisect says why it names no op.
TEST(BisectAtenTrace, ARunWithModuleTracesIsReplayedAgainstTheGoldensAtenTraces) {
  const auto [golden, moved] = golden_and_run("levels", run::TraceLevel::kOps);
  std::vector<std::string> replayed;
  const Bisection b = bisect(golden, moved, load_budgets(kShippedBudgets), aten_replay(replayed));
  EXPECT_EQ(replayed, std::vector<std::string>{moved.path});
  EXPECT_EQ(b.op_source, "the aten trace A holds (recorded at golden refresh) and replay of B");
  ASSERT_TRUE(b.first_divergent_op.has_value()) << b.no_op;
  EXPECT_EQ(b.first_divergent_op->index, 2);
  const Bisection unreplayed = bisect(golden, moved, load_budgets(kShippedBudgets));
  EXPECT_FALSE(unreplayed.first_divergent_op.has_value());
  EXPECT_NE(unreplayed.no_op.find("hold traces of other levels"), std::string::npos) << unreplayed.no_op;
}

// Where the runs part by running different ops (a fault's own op, changed code), the op
// after it, judged on each side's operands, would be "rounding" on both: bisect says the
// runs run different ops and judges nothing (it once said "both within their bounds: rounding").
TEST(BisectAtenTrace, RunsThatRunDifferentOpsAreNotCalledRounding) {
  const auto [golden, moved] = golden_and_run("other_ops", run::TraceLevel::kNone);
  const TraceProvider another_op = [](const ReceiptData&, int step) {
    receipt::AtenTraceStep t = step_trace(step, 7);
    t.columns[2].tensor = "aten.where.self";  // B runs another op at column 2
    return OpTrace{t.columns, t.hashes, t.l2, t.projection, t.sites, kAtenLevel};
  };
  int judged = 0;
  const OracleProvider within = [&judged](const ReceiptData&, int, const DivergentOp&) {
    ++judged;
    OracleSide side;
    side.judged = side.within = true;
    return side;
  };
  const Bisection b = bisect(golden, moved, load_budgets(kShippedBudgets), another_op, within);
  ASSERT_TRUE(b.first_divergent_op.has_value()) << b.no_op;
  EXPECT_EQ(b.first_divergent_op->other, "B runs hidden optimizer aten.where.self here");
  ASSERT_TRUE(b.oracle.has_value());
  EXPECT_EQ(b.oracle->verdict, "not a question of rounding: the runs run different ops here (B runs hidden optimizer "
                               "aten.where.self here); the oracle judges an op both runs run");
  EXPECT_EQ(judged, 0);
  EXPECT_FALSE(b.oracle->a.judged || b.oracle->b.judged);
}

}  // namespace
}  // namespace harness::check
