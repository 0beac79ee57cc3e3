#include "python_oracle.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "file_io.h"
#include "python_canary.h"
#include "numerics/function_bounds.h"
#include "receipt/hdf5_file.h"

namespace harness::run {
namespace {

using numerics::Precision;

// The precisions a Python run may declare and a captured result may have (capture-ops'
// FORMATS); none for another name.
std::optional<Precision> python_precision(const std::string& name) {
  for (const Precision p : {Precision::Fp32, Precision::Bf16}) {
    if (numerics::to_string(p) == name) return p;
  }
  return std::nullopt;
}

Precision stored_format(const std::string& name, const std::string& values) {
  if (const std::optional<Precision> p = python_precision(name)) return *p;
  throw std::runtime_error(fmt::format("{}: a result stored in '{}', which the oracle has no bound for", values, name));
}

// The terms a kind's bound reads beside its values (tracing/module_capture.py and
// op_capture.py write them by name), each of `count` values, in the order of `names`; one
// line naming the group and the kind (`what`) where one has another count.
std::vector<std::vector<double>> read_terms(hid_t file, const std::string& group, std::initializer_list<const char*> names,
                                            std::size_t count, const std::string& values, std::string_view what) {
  std::vector<std::vector<double>> terms;
  for (const char* name : names) {
    terms.push_back(h5::read_f64(file, group + name));
    if (terms.back().size() != count) {
      throw std::runtime_error(fmt::format("{}: {} holds {}'s terms of another count than its values", values, group, what));
    }
  }
  return terms;
}

// A layer norm module's bound per element (numerics::layer_norm_output_bound): `scaled` is the
// result's magnitude.
std::vector<double> layer_norm_bounds(std::int64_t channels, const std::vector<double>& scaled, hid_t file,
                                      const std::string& group, const std::string& values) {
  const auto t = read_terms(file, group, {"offset", "mean_term", "conditioning"}, scaled.size(), values, "a layer norm");
  std::vector<double> bound(scaled.size());
  for (std::size_t i = 0; i < scaled.size(); ++i) {
    bound[i] = numerics::layer_norm_output_bound({channels, t[2][i], scaled[i], t[1][i], t[0][i]});
  }
  return bound;
}

// A layer norm's rstd per element (aten.native_layer_norm's third result): its relative
// error (numerics::layer_norm_rstd_error) from the row's rho, times |r| (`magnitude`).
std::vector<double> layer_norm_rstd_bounds(std::int64_t channels, const std::vector<double>& magnitude, hid_t file,
                                           const std::string& group, const std::string& values) {
  const auto t = read_terms(file, group, {"conditioning"}, magnitude.size(), values, "a layer norm's rstd");
  std::vector<double> bound(magnitude.size());
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    bound[i] = numerics::layer_norm_rstd_error(channels, t[0][i]) * magnitude[i];
  }
  return bound;
}

// An attention core module's bound per element (numerics::attention_output_bound):
// `magnitude` is sum_j p_j |v_jc|.
std::vector<double> attention_bounds(std::int64_t head_size, const std::vector<double>& magnitude, hid_t file,
                                     const std::string& group, const std::string& values) {
  const auto t = read_terms(file, group, {"keys", "abs_products", "abs_dot", "spread", "abs_values"}, magnitude.size(),
                            values, "an attention core");
  if (head_size < 1) throw std::runtime_error(fmt::format("{}: {} is an attention core of head size {}", values, group, head_size));
  std::vector<double> bound(magnitude.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    const auto key_count = static_cast<std::int64_t>(t[0][i]);
    if (key_count < 1 || static_cast<double>(key_count) != t[0][i]) {
      throw std::runtime_error(fmt::format("{}: {} gives an attention row {} keys", values, group, t[0][i]));
    }
    bound[i] = numerics::attention_output_bound({head_size, key_count, scale, t[1][i], t[2][i], t[3][i], magnitude[i], t[4][i]});
  }
  return bound;
}

// A softmax's probabilities (aten._softmax: scores it was given, so no error in them) per
// element (numerics::softmax_probability_bound): each score's distance from its row's max
// and the row's largest distance (0 for a masked score, whose probability is exactly 0).
// `probabilities` is the exact result; `row` its length.
std::vector<double> softmax_bounds(std::int64_t row, const std::vector<double>& probabilities, hid_t file,
                                   const std::string& group, const std::string& values) {
  const auto t = read_terms(file, group, {"distance", "spread"}, probabilities.size(), values, "a softmax");
  if (row < 1) throw std::runtime_error(fmt::format("{}: {} is a softmax of rows of {}", values, group, row));
  std::vector<double> bound(probabilities.size());
  for (std::size_t i = 0; i < probabilities.size(); ++i) {
    const double eta = numerics::softmax_exponent_error(0, 0, t[0][i]);
    const double max_eta = numerics::softmax_exponent_error(0, 0, t[1][i]);
    bound[i] = numerics::softmax_probability_bound(probabilities[i], eta, max_eta, row, numerics::kStackExpUlps);
  }
  return bound;
}

// GELU's bound per element (numerics::gelu_output_bound): the input, the exact argument and
// f of it; the form's function at the stacks' measured worst case.
std::vector<double> gelu_bounds(numerics::GeluForm form, std::size_t elements, hid_t file, const std::string& group,
                                const std::string& values) {
  const auto t = read_terms(file, group, {"input", "argument", "function"}, elements, values, "a GELU");
  const double function_error =
      form == numerics::GeluForm::Tanh ? numerics::kStackGeluTanhError : numerics::kStackGeluErfError;
  std::vector<double> bound(elements);
  for (std::size_t i = 0; i < elements; ++i) {
    bound[i] = numerics::gelu_output_bound({form, t[0][i], t[1][i], t[2][i], function_error});
  }
  return bound;
}

// GELU's backward (erf form) per element (numerics::gelu_erf_backward_bound): the input, the
// gradient, Phi and phi of the input; erf and exp at the stacks' measured worst case.
std::vector<double> gelu_backward_bounds(std::size_t elements, hid_t file, const std::string& group,
                                         const std::string& values) {
  const auto t = read_terms(file, group, {"input", "grad", "cdf", "pdf"}, elements, values, "a GELU backward");
  std::vector<double> bound(elements);
  for (std::size_t i = 0; i < elements; ++i) {
    bound[i] = numerics::gelu_erf_backward_bound({t[0][i], t[1][i], t[2][i], t[3][i]}, numerics::kStackGeluErfError,
                                                 numerics::kStackExpUlps);
  }
  return bound;
}

// SwiGLU's bound per element (numerics::swiglu_output_bound) from |silu(g) up| (the
// magnitude) and |up|.
std::vector<double> swiglu_bounds(const std::vector<double>& magnitude, hid_t file, const std::string& group,
                                  const std::string& values) {
  const auto t = read_terms(file, group, {"up"}, magnitude.size(), values, "a SwiGLU");
  std::vector<double> bound(magnitude.size());
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    bound[i] = numerics::swiglu_output_bound(magnitude[i], t[0][i], numerics::kStackSiluError);
  }
  return bound;
}

// The mean cross-entropy's bound (numerics::cross_entropy_mean_bound): one value, from the
// terms module_capture.py writes per row (its max, log of its softmax's sum, its target's
// logit and its spread); `classes` the rows' length.
std::vector<double> cross_entropy_bounds(std::int64_t classes, std::size_t elements, hid_t file, const std::string& group,
                                         const std::string& values) {
  const std::size_t rows = h5::read_f64(file, group + "max").size();
  const auto t = read_terms(file, group, {"max", "log_sum", "target", "spread"}, rows, values, "a cross-entropy");
  if (elements != 1 || rows == 0 || classes < 1) {
    throw std::runtime_error(fmt::format("{}: {} is not one mean cross-entropy with its rows' terms", values, group));
  }
  std::vector<numerics::CrossEntropyRow> terms(rows);
  for (std::size_t i = 0; i < rows; ++i) terms[i] = {t[0][i], t[1][i], t[2][i], t[3][i]};
  return {numerics::cross_entropy_mean_bound(terms, classes, numerics::kStackExpUlps, numerics::kStackLogUlps)};
}

// A log-softmax's outputs (aten._log_softmax, from the scores it was given) per element
// (numerics::log_softmax_bound): the row's max, log of its sum of exps and spread, and the
// element's own score; `classes` the rows' length.
std::vector<double> log_softmax_bounds(std::int64_t classes, std::size_t elements, hid_t file, const std::string& group,
                                       const std::string& values) {
  const auto t = read_terms(file, group, {"max", "log_sum", "value", "spread"}, elements, values, "a log-softmax");
  if (classes < 1) throw std::runtime_error(fmt::format("{}: {} is a log-softmax of rows of {}", values, group, classes));
  std::vector<double> bound(elements);
  for (std::size_t i = 0; i < elements; ++i) {
    bound[i] = numerics::log_softmax_bound({t[0][i], t[1][i], t[2][i], t[3][i]}, classes, numerics::kStackExpUlps,
                                           numerics::kStackLogUlps);
  }
  return bound;
}

// A log-softmax's backward per element (numerics::log_softmax_backward_bound): exp of the
// output it was given, |sum g| and sum |g| of its row; `magnitude` |the exact result|.
std::vector<double> log_softmax_backward_bounds(std::int64_t n, const std::vector<double>& magnitude, hid_t file,
                                                const std::string& group, const std::string& values) {
  const auto t = read_terms(file, group, {"probability", "sum", "sum_abs"}, magnitude.size(), values,
                            "a log-softmax's backward");
  if (n < 1) throw std::runtime_error(fmt::format("{}: {} is a log-softmax backward of rows of {}", values, group, n));
  std::vector<double> bound(magnitude.size());
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    bound[i] = numerics::log_softmax_backward_bound(t[0][i], t[1][i], t[2][i], magnitude[i], n, numerics::kStackExpUlps);
  }
  return bound;
}

// Each element's bound before its result is stored, by the arithmetic capture-ops names:
// a dot product of `count` terms, a sum of `count` terms, or `count` roundings of an exact
// value or SiLU (tracing/op_capture.py), all computed in fp32; a softmax's, a log-softmax's
// and its backward's, GELU's and a layer norm's rstd (aten) and a layer norm's, an attention core's, SwiGLU's or the loss's
// (modules, and aten's layer norm output) from their terms (tracing/module_capture.py).
std::vector<double> compute_bounds(const std::string& kind, std::int64_t count, const std::vector<double>& magnitude,
                                   hid_t file, const std::string& group, const std::string& values) {
  if (kind == "layer_norm") return layer_norm_bounds(count, magnitude, file, group, values);
  if (kind == "layer_norm_rstd") return layer_norm_rstd_bounds(count, magnitude, file, group, values);
  if (kind == "attention") return attention_bounds(count, magnitude, file, group, values);
  if (kind == "softmax") return softmax_bounds(count, magnitude, file, group, values);
  if (kind == "gelu_tanh") return gelu_bounds(numerics::GeluForm::Tanh, magnitude.size(), file, group, values);
  if (kind == "gelu_erf") return gelu_bounds(numerics::GeluForm::Erf, magnitude.size(), file, group, values);
  if (kind == "swiglu") return swiglu_bounds(magnitude, file, group, values);
  if (kind == "gelu_erf_backward") return gelu_backward_bounds(magnitude.size(), file, group, values);
  if (kind == "cross_entropy") return cross_entropy_bounds(count, magnitude.size(), file, group, values);
  if (kind == "log_softmax") return log_softmax_bounds(count, magnitude.size(), file, group, values);
  if (kind == "log_softmax_backward") return log_softmax_backward_bounds(count, magnitude, file, group, values);
  const double u = numerics::precision_traits(Precision::Fp32).unit_roundoff;
  if (static_cast<double>(count) * u >= 1) {  // gamma_n says nothing there (a sum of 2^24 terms): no bound
    return std::vector<double>(magnitude.size(), std::numeric_limits<double>::infinity());
  }
  // Each rounding may also lose what gradual underflow does (the model of rounding_bounds.h:
  // half a subnormal step; a whole one is taken, for the chain's scalings): a product or
  // quotient that lands below the least normal value.
  const double underflow = static_cast<double>(count) * numerics::precision_traits(Precision::Fp32).smallest_spacing;
  std::vector<double> bound(magnitude.size());
  for (std::size_t i = 0; i < magnitude.size(); ++i) {
    const double m = magnitude[i];
    if (kind == "dot") {
      bound[i] = numerics::dot_product_bound(count, m, Precision::Fp32) + underflow;
    } else if (kind == "sum") {
      bound[i] = numerics::recursive_sum_bound(count, m, Precision::Fp32) + underflow;
    } else if (kind == "rounded") {
      bound[i] = count == 0 ? 0.0 : numerics::gamma(count, u) * m + underflow;
    } else if (kind == "two_norm") {
      // n + 2 roundings relative; squares below the least normal lose at most n 2^-150 of
      // the sum, sqrt(n) 2^-75 of its root, twice that with the relative term's share.
      bound[i] = numerics::gamma(count, u) * m + 2 * std::sqrt(static_cast<double>(count)) * std::ldexp(1.0, -75);
    } else if (kind == "silu") {
      bound[i] = numerics::silu_output_bound(m, numerics::kStackSiluError);
    } else {
      throw std::runtime_error(
          fmt::format("{}: a result of arithmetic '{}' (known: dot, sum, rounded, two_norm, silu, layer_norm, layer_norm_rstd, attention, softmax, gelu_tanh, gelu_erf, gelu_erf_backward, swiglu, cross_entropy, log_softmax, log_softmax_backward)", values, kind));
    }
  }
  return bound;
}

OpJudgement judge_result(const nlohmann::json& r, hid_t file, std::size_t index, const std::string& values,
                         Precision declared) {
  const std::string group = fmt::format("results/{}/", index);
  const std::vector<double> got = h5::read_f64(file, group + "got");
  const std::vector<double> exact = h5::read_f64(file, group + "exact");
  const std::vector<double> magnitude = h5::read_f64(file, group + "magnitude");
  if (exact.size() != got.size() || magnitude.size() != got.size()) {
    throw std::runtime_error(fmt::format("{}: {} holds {}, {} and {} values where one count is wanted", values, group,
                                         got.size(), exact.size(), magnitude.size()));
  }
  OpJudgement j;
  j.site = r.at("op").get<std::string>();
  j.op = r.at("aten").get<std::string>();
  j.phase = r.at("phase").get<std::string>();
  j.result = "out";
  // As a trace names the output: an aten trace by its aten op overload, an op trace (a
  // module's, capture-ops --level modules) by its column, which the capture gives.
  j.tensor = r.value("tensor", j.op);
  // One of an aten op's several results by its place (`aten.native_layer_norm.default.out2`).
  if (j.tensor.size() > j.op.size() + 4 && j.tensor.compare(0, j.op.size() + 4, j.op + ".out") == 0) {
    j.result = j.tensor.substr(j.op.size() + 1);
  }
  j.operands = r.at("operands").get<std::string>();
  j.source = r.value("site", "");
  j.occurrence = r.value("occurrence", -1);
  const Precision stored = stored_format(r.at("stored").get<std::string>(), values);
  // A format narrower than the declared one is no rounding the run allows: judged as if
  // stored in the declared format (bf16 and fp32 are the only two: narrower is bf16).
  std::vector<double> bound =
      compute_bounds(r.at("kind").get<std::string>(), r.at("count").get<std::int64_t>(), magnitude, file, group, values);
  if (stored == Precision::Bf16 && declared == Precision::Fp32) {
    // One rounding to fp32 allowed, as a conversion stored in fp32 has: the ratio then says
    // how far below fp32 it went (2^16 ulps of fp32 for bf16's 8 bits), never "infinitely".
    for (std::size_t i = 0; i < bound.size(); ++i) bound[i] += numerics::rounding_bound(std::fabs(exact[i]) + bound[i], declared);
    j.below = fmt::format("its result is {}, below the {} the run declares", numerics::to_string(stored),
                          numerics::to_string(declared));
    judge_values(j, got, exact, bound, declared);
  } else {
    judge_values(j, got, exact, bound, stored);
  }
  return j;
}

}  // namespace

Precision declared_precision(const std::string& name) {
  if (const std::optional<Precision> p = python_precision(name)) return *p;
  throw std::invalid_argument(fmt::format("a run of precision '{}', which the oracle has no bound for (fp32, bf16)", name));
}

PythonStepJudgement judge_python_step(const std::string& receipt, const std::map<std::string, std::string>& manifest,
                                      int step, std::optional<Precision> against, ChildOutput stderr_mode,
                                      const std::vector<std::string>& flags) {
  const TempDir work("precision", "a Python canary's captured ops");
  const std::string values = work.file("values.h5");
  std::vector<std::string> capture_flags{"--step", std::to_string(step), "--values", values};
  capture_flags.insert(capture_flags.end(), flags.begin(), flags.end());
  const PythonCommand command = python_canary_command("capture-ops", receipt, manifest, capture_flags);
  const PythonJsonResult captured = run_python_for_json(command.argv, command.environment, ChildOutput::kStderr, stderr_mode);
  const int code = captured.child.exit_code();
  if (code != 0 && code != 1) {  // the package's own error: on stderr, or (captured) its last line here
    throw PythonCaptureError(code, last_line(captured.child.stderr_tail));
  }
  const nlohmann::json& c = captured.result;
  if (!c.is_object()) {
    throw PythonCaptureError(2, fmt::format("{}: its capture {} but wrote no result", receipt, captured.child.how()));
  }
  if (code == 1) {
    const nlohmann::json& m = c.at("first_mismatch");
    throw PythonCaptureError(1, fmt::format("{}: a replay does not reproduce step {} ({}); its ops cannot be judged as "
                                            "they ran",
                                            receipt, m.at("step").get<int>(), m.at("what").get<std::string>()));
  }
  const Precision declared = against ? *against : declared_precision(c.at("precision").get<std::string>());
  return {judge_captured_step(c, values, declared), c.at("lane").get<std::string>(), c.at("seconds").get<double>()};
}

OracleReport judge_captured_step(const nlohmann::json& description, const std::string& values, Precision declared) {
  OracleReport report;
  try {
    const h5::Handle file = h5::open_file(values, /*writable=*/false);
    const nlohmann::json& results = description.at("results");
    for (std::size_t i = 0; i < results.size(); ++i) {
      report.judged.push_back(judge_result(results[i], file, i, values, declared));
    }
    for (const auto& [op, calls] : description.at("not_judged").items()) report.not_judged[op] = calls.get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: its description is not what capture-ops writes: {}", values, e.what()));
  } catch (const h5::Hdf5Error& e) {
    throw std::runtime_error(e.what());
  }
  return report;
}

}  // namespace harness::run
