// The judgement of a Python canary's captured ops (harness/run/python_oracle.h): each
// arithmetic's bound as rounding_bounds.h gives it, attained and exceeded by one ulp; a bf16
// result of an fp32 run judged below it; a capture file that is not what capture-ops
// writes refused naming the file.
#include "python_oracle.h"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/function_bounds.h"
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
  std::map<std::string, std::vector<double>> terms = {};  // what a kind's bound reads beside the values
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
    for (const auto& [name, values] : r.terms) {
      h5::write_dataset(group, name.c_str(), H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {values.size()}, values.data());
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

// Gradual underflow: each rounding of a result below the least normal value may lose half a
// subnormal step (a whole one is allowed) (an AdamW moment decaying into subnormals, a square that underflows), and a
// 2-norm's squares lose up to n 2^-150 of its sum; an exact value past fp32's range is
// unbounded (its overflow to inf is its rounding), not infinitely over.
TEST(PythonOracle, UnderflowLosesASubnormalStepPerRoundingAndOverflowIsUnbounded) {
  const testing::ScratchDir dir;
  const double step = std::ldexp(1.0, -149);  // fp32's least subnormal
  const double tiny = 1e-40;                  // a norm of values whose squares all underflow
  const std::vector<Captured> results = {
      // 1.5 steps lost is within four roundings' allowance (a step each); 5 steps is past it
      {"rounded", 4, "fp32", {0.0, 5 * step}, {1.5 * step, 0.0}, {1.5 * step, 0.0}},
      {"two_norm", 102, "fp32", {0.0, 0.0}, {tiny, 1e-20}, {tiny, 1e-20}},             // 1e-20 is past 2 sqrt(102) 2^-75
      {"rounded", 1, "fp32", {std::numeric_limits<double>::infinity()}, {1e39}, {1e39}},
  };
  const std::string values = dir.path("values.h5");
  const OracleReport report = judge_captured_step(write_capture(values, results), values, Precision::Fp32);
  ASSERT_EQ(report.judged.size(), 3u);
  EXPECT_EQ(report.judged[0].over, 1);
  EXPECT_EQ(report.judged[0].worst_index, 1);
  EXPECT_EQ(report.judged[1].over, 1);
  EXPECT_EQ(report.judged[1].worst_index, 1);
  EXPECT_EQ(report.judged[2].over, 0);
  EXPECT_EQ(report.judged[2].unbounded, 1);
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

// The kinds whose bounds read terms (engines/numerics/function_bounds.h): each element held
// to the bound the header's function gives for its terms, just inside it and just past it.
TEST(PythonOracle, TheFunctionKindsReadTheirTermsAndHoldEachElementToItsBound) {
  const testing::ScratchDir dir;
  const double y = 0.5;
  const numerics::AttentionOutputTerms a{16, 3, 0.25, 2.0, 1.0, 1.5, y, 1.0};
  const double attention = numerics::attention_output_bound(a);
  const double gelu = numerics::gelu_output_bound({numerics::GeluForm::Tanh, 1.0, 0.83, std::tanh(0.83),
                                                   numerics::kStackGeluTanhError});
  const double swiglu = numerics::swiglu_output_bound(y, 2.0, numerics::kStackSiluError);
  const std::vector<numerics::CrossEntropyRow> rows = {{1.0, 2.0, 0.5, 3.0}, {0.0, 1.5, -0.5, 2.0}};
  const double loss = 0.5 * ((1.0 + 2.0 - 0.5) + (0.0 + 1.5 + 0.5));
  const double cross_entropy = numerics::cross_entropy_mean_bound(rows, 32, numerics::kStackExpUlps,
                                                                   numerics::kStackLogUlps);
  const auto twice = [](double v) { return std::vector<double>{v, v}; };
  const std::vector<Captured> results = {
      {"attention", 16, "fp32", {y + attention * 0.999, y + attention * 1.001}, twice(y), twice(y),
       {{"keys", twice(3)}, {"abs_products", twice(2)}, {"abs_dot", twice(1)}, {"spread", twice(1.5)},
        {"abs_values", twice(1)}}},
      {"gelu_tanh", 1, "fp32", {y + gelu * 0.999, y + gelu * 1.001}, twice(y), twice(y),
       {{"input", twice(1.0)}, {"argument", twice(0.83)}, {"function", twice(std::tanh(0.83))}}},
      {"swiglu", 1, "fp32", {y + swiglu * 0.999, y + swiglu * 1.001}, twice(y), twice(y), {{"up", twice(2.0)}}},
      {"cross_entropy", 32, "fp32", {loss + cross_entropy * 1.001}, {loss}, {loss},
       {{"max", {1.0, 0.0}}, {"log_sum", {2.0, 1.5}}, {"target", {0.5, -0.5}}, {"spread", {3.0, 2.0}}}},
  };
  const std::string values = dir.path("values.h5");
  const OracleReport report = judge_captured_step(write_capture(values, results), values, Precision::Fp32);
  ASSERT_EQ(report.judged.size(), results.size());
  for (std::size_t i = 0; i < results.size(); ++i) {  // element 0 within (the loss's one value past), element 1 past
    EXPECT_EQ(report.judged[i].over, 1) << results[i].kind;
    EXPECT_EQ(report.judged[i].worst_index, results[i].kind == "cross_entropy" ? 0 : 1) << results[i].kind;
  }
}

// A term of another count, an attention row of a fractional number of keys, or a loss of two
// values is refused in one line naming the file, never judged against a wrong bound.
TEST(PythonOracle, BadTermsAreRefusedNamingTheFile) {
  const testing::ScratchDir dir;
  const auto refused = [&](const Captured& result) {
    const std::string values = dir.path("values.h5");
    try {
      judge_captured_step(write_capture(values, {result}), values, Precision::Fp32);
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find(values) != std::string::npos;
    }
    return false;
  };
  const std::map<std::string, std::vector<double>> attention = {
      {"keys", {2}}, {"abs_products", {1}}, {"abs_dot", {1}}, {"spread", {1}}, {"abs_values", {1}}};
  auto short_term = attention, fractional = attention;
  short_term["spread"] = {};
  fractional["keys"] = {1.5};
  EXPECT_TRUE(refused({"attention", 8, "fp32", {1.0}, {1.0}, {1.0}, short_term}));
  EXPECT_TRUE(refused({"attention", 8, "fp32", {1.0}, {1.0}, {1.0}, fractional}));
  EXPECT_TRUE(refused({"swiglu", 1, "fp32", {1.0}, {1.0}, {1.0}, {}}));  // its |up| absent
  EXPECT_TRUE(refused({"cross_entropy", 8, "fp32", {1.0, 1.0}, {1.0, 1.0}, {1.0, 1.0},
                       {{"max", {1}}, {"log_sum", {1}}, {"target", {1}}, {"spread", {1}}}}));
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
