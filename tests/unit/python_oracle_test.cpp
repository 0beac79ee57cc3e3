// The judgement of a Python canary's captured ops (harness/run/python_oracle.h): each
// arithmetic's bound as rounding_bounds.h gives it, attained and exceeded by one ulp; a bf16
// result of an fp32 run judged below it; a capture file that is not what capture-ops
// writes refused naming the file.
#include "python_oracle.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "receipt/hdf5_file.h"
#include "scratch_dir.h"

namespace harness::run {
namespace {

using numerics::Precision;

struct Captured {
  std::string kind;
  std::int64_t count = 0;
  std::string stored = "fp32";
  std::vector<double> got, exact, magnitude;
};

// capture-ops' two outputs for `results`: the description, and the values at `path`.
nlohmann::json write_capture(const std::string& path, const std::vector<Captured>& results) {
  const h5::Handle file = h5::create_file(path, /*overwrite=*/true);
  const h5::Handle all = h5::create_group(file, "results");
  nlohmann::json description = {{"results", nlohmann::json::array()}, {"not_judged", {{"aten.gelu.default", 2}}}};
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Captured& r = results[i];
    const h5::Handle group = h5::create_group(all, std::to_string(i));
    for (const auto& [name, values] : {std::pair{"got", &r.got}, {"exact", &r.exact}, {"magnitude", &r.magnitude}}) {
      h5::write_dataset(group, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {values->size()}, values->data());
    }
    description["results"].push_back({{"op", "h.0.mlp"}, {"aten", "aten.addmm.default"}, {"phase", "forward"},
                                      {"site", "model.py:12"}, {"kind", r.kind}, {"count", r.count},
                                      {"stored", r.stored}, {"operands", "fp32"}});
  }
  return description;
}

// The next double above `x` by `ulps` of fp32 at x.
double plus_ulps(double x, double ulps) { return x + ulps * numerics::ulp_of(x, Precision::Fp32); }

TEST(PythonOracle, EachArithmeticIsHeldToItsBoundExactly) {
  const testing::ScratchDir dir;
  const double m = 3.0, y = 1.0;
  const double dot = numerics::dot_product_bound(17, m, Precision::Fp32);
  const double sum = numerics::recursive_sum_bound(9, m, Precision::Fp32);
  const double two = numerics::gamma(2, numerics::precision_traits(Precision::Fp32).unit_roundoff) * y;
  const std::vector<Captured> results = {
      {"dot", 17, "fp32", {y + dot, y + std::nextafter(dot, 1.0) * 1.001}, {y, y}, {m, m}},
      {"sum", 9, "fp32", {y - sum, y - sum * 1.001}, {y, y}, {m, m}},
      {"rounded", 2, "fp32", {y + two, y + two * 1.001}, {y, y}, {y, y}},
      {"rounded", 0, "fp32", {y, plus_ulps(y, 1)}, {y, y}, {y, y}},  // a copy: exact
  };
  const std::string values = dir.path("values.h5");
  const OracleReport report = judge_captured_step(write_capture(values, results), values, Precision::Fp32);
  ASSERT_EQ(report.judged.size(), results.size());
  for (const OpJudgement& j : report.judged) {
    EXPECT_EQ(j.over, 1) << j.op;  // element 0 at its bound exactly, element 1 just past it
    EXPECT_EQ(j.worst_index, 1);
    EXPECT_EQ(j.source, "model.py:12");
    EXPECT_TRUE(j.below.empty());
  }
  EXPECT_EQ(report.not_judged.at("aten.gelu.default"), 2);
}

TEST(PythonOracle, ABf16ResultIsBelowAnFp32RunAndWithinABf16One) {
  const testing::ScratchDir dir;
  const double y = 1.0 + 1.0 / 3.0;
  const double in_bf16 = 1.3359375;  // y rounded to bf16: 8 bits
  const std::string values = dir.path("values.h5");
  const nlohmann::json d = write_capture(values, {{"rounded", 0, "bf16", {in_bf16}, {y}, {y}}});
  const OracleReport fp32 = judge_captured_step(d, values, Precision::Fp32);
  EXPECT_EQ(fp32.judged.at(0).over, 1);
  EXPECT_EQ(fp32.judged.at(0).stored, "fp32");
  EXPECT_EQ(fp32.judged.at(0).below, "its result is bf16, below the fp32 the run declares");
  EXPECT_GT(fp32.judged.at(0).worst_ratio, 1e4);  // 2^16 ulps of fp32 apart at most: finite, named
  EXPECT_TRUE(std::isfinite(fp32.judged.at(0).worst_ratio));
  const OracleReport bf16 = judge_captured_step(d, values, Precision::Bf16);
  EXPECT_EQ(bf16.judged.at(0).over, 0);
  EXPECT_EQ(bf16.judged.at(0).stored, "bf16");
}

TEST(PythonOracle, ACaptureThatIsNotCaptureOpsIsRefusedNamingTheFile) {
  const testing::ScratchDir dir;
  const std::string values = dir.path("values.h5");
  nlohmann::json d = write_capture(values, {{"dot", 4, "fp32", {1.0}, {1.0}, {1.0}}});
  const auto refused = [&](const nlohmann::json& description, const std::string& file) {
    try {
      judge_captured_step(description, file, Precision::Fp32);
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find(file) != std::string::npos;
    }
    return false;
  };
  nlohmann::json unknown_kind = d, no_results = d, fp16 = d, extra = d;
  unknown_kind["results"][0]["kind"] = "exp";
  no_results.erase("results");
  fp16["results"][0]["stored"] = "fp16";
  extra["results"].push_back(d["results"][0]);  // results/1 is not in the file
  EXPECT_TRUE(refused(unknown_kind, values));
  EXPECT_TRUE(refused(no_results, values));
  EXPECT_TRUE(refused(fp16, values));
  EXPECT_TRUE(refused(extra, values));
  EXPECT_TRUE(refused(d, dir.path("absent.h5")));
  EXPECT_THROW(declared_precision("fp8"), std::invalid_argument);
}

}  // namespace
}  // namespace harness::run
