#include "bisect.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "receipt/aten_trace.h"

namespace harness::check {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Runs that make the same roundings: the first step where a loss, a gradient norm or a
// hash differs by a single bit; the first hash that differs names the tensor.
void bisect_bitwise(const ReceiptData& a, const ReceiptData& b, Bisection& out) {
  const std::optional<TensorMove> moved = first_moved(a, b);
  int first_scalar = -1;
  for (int s = 0; s < a.steps() && first_scalar < 0; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (!same_bits(a.loss[i], b.loss[i]) || !same_bits(a.grad_norm[i], b.grad_norm[i])) first_scalar = s;
  }
  if (moved && (first_scalar < 0 || moved->step <= first_scalar)) {
    out.first_divergent_step = moved->step;
    out.first_divergent_tensor = moved;
    out.first_divergent_metric = "hashes";
  } else if (first_scalar >= 0) {
    out.first_divergent_step = first_scalar;
    out.first_divergent_metric = same_bits(a.loss[static_cast<std::size_t>(first_scalar)],
                                           b.loss[static_cast<std::size_t>(first_scalar)]) ? "grad_norm" : "loss";
  }
}

// Runs that do not: the first step where a metric leaves the composed budget; a sketch
// distance names the tensor.
void bisect_budgeted(const ReceiptData& a, const ReceiptData& b, const ComposedBudget& budget, Bisection& out) {
  for (const Deviation& d : metric_deviations(a, b)) {
    const double allowed = budget.allowed(d.metric, d.step, d.reference);
    if (!(d.deviation > allowed) && !std::isnan(d.deviation)) continue;
    out.first_divergent_step = d.step;
    out.first_divergent_metric = d.metric;
    out.deviation = d.deviation;
    out.allowed = allowed;
    if (!d.tensor.empty()) out.first_divergent_tensor = TensorMove{"params", d.tensor, d.step, d.deviation};
    return;  // deviations come in step order
  }
}

// The first step where any traced op output differs by a bit; -1 when none does.
int first_trace_step(const OpTrace& a, const OpTrace& b) {
  if (a.columns != b.columns) return -1;
  const std::size_t width = a.columns.size();
  for (int s = 0; s < std::min(a.rows(), b.rows()); ++s) {
    const auto row = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s) * width);
    if (!std::equal(a.hashes.begin() + row, a.hashes.begin() + row + static_cast<std::ptrdiff_t>(width), b.hashes.begin() + row)) {
      return s;
    }
  }
  return -1;
}

// Where a step's trace came from: the receipt's /trace, the aten trace a golden holds
// (/aten_trace, made at refresh), or a replay of the run now.
enum class TraceFrom { kReceipt, kStored, kReplay };

// One step of a trace, and where it came from.
struct TraceRow {
  OpTrace trace;  // one row
  TraceFrom from = TraceFrom::kReceipt;
};

OpTrace receipt_row(const ReceiptData& run, int step) {
  const OpTrace& t = *run.trace;
  const std::size_t r = t.columns.size(), at = static_cast<std::size_t>(step) * r;
  return {t.columns, receipt::rows(t.hashes, at, r), receipt::rows(t.l2, at, r),
          receipt::rows(t.projection, at, r, receipt::kSketchWidth), {}};
}

// A damaged /aten_trace leaves bisect's step and tensor standing: the op is unknown, and why.
OpTrace stored_aten_row(const ReceiptData& run, int step) {
  receipt::AtenTraceStep stored;
  try {
    stored = receipt::read_aten_trace_step(receipt::ReceiptReader(run.path), step);
  } catch (const std::exception& e) {  // ReceiptError, h5::Hdf5Error
    throw TraceUnavailable(e.what());
  }
  return {std::move(stored.columns), std::move(stored.hashes), std::move(stored.l2), std::move(stored.projection),
          std::move(stored.sites), kAtenLevel};
}

// Whether the run holds traces of `level` itself: /trace (ops) or /aten_trace.
bool holds(const ReceiptData& run, const std::string& level) {
  return level == kOpsLevel ? run.trace.has_value() : level == kAtenLevel && run.aten_trace;
}

// The run's own trace of `step` at `level`, where it holds one.
std::optional<TraceRow> own_row(const ReceiptData& run, int step, const std::string& level) {
  if (!holds(run, level)) return std::nullopt;
  if (level == kOpsLevel) return TraceRow{receipt_row(run, step), TraceFrom::kReceipt};
  return TraceRow{stored_aten_row(run, step), TraceFrom::kStored};
}

// Both runs' traces of `step`, of one level: only like traces compare (a module's output
// is no aten op's). Traces the receipts hold first; otherwise a replay of the run that
// holds none (or only module ops, where the other holds aten traces: a Python canary's
// replay traces aten ops), and of the other too unless it holds a trace of the replay's level.
std::pair<TraceRow, TraceRow> rows_of(const ReceiptData& a, const ReceiptData& b, int step, const TraceProvider& replay) {
  for (const char* level : {kOpsLevel, kAtenLevel}) {
    if (holds(a, level) && holds(b, level)) return {*own_row(a, step, level), *own_row(b, step, level)};
  }
  const bool a_first = !(a.trace || a.aten_trace) || (b.aten_trace && !a.aten_trace);
  const ReceiptData& first = a_first ? a : b;
  const ReceiptData& other = a_first ? b : a;
  if (!replay) {
    throw TraceUnavailable(first.trace || first.aten_trace
                               ? fmt::format("{} and {} hold traces of other levels (module ops, aten ops); bisect "
                                             "without --no-replay replays {} with aten traces",
                                             first.path, other.path, first.path)
                               : fmt::format("{} has no op trace (run it with --trace ops)", first.path));
  }
  TraceRow replayed{replay(first, step), TraceFrom::kReplay};
  std::optional<TraceRow> kept = own_row(other, step, replayed.trace.level);
  TraceRow second = kept ? std::move(*kept) : TraceRow{replay(other, step), TraceFrom::kReplay};
  if (second.trace.level != replayed.trace.level) {
    throw TraceUnavailable(fmt::format("the traces of {} ({}) and {} ({}) are of other levels and do not compare",
                                       first.path, replayed.trace.level, other.path, second.trace.level));
  }
  return a_first ? std::pair{std::move(replayed), std::move(second)} : std::pair{std::move(second), std::move(replayed)};
}

// Where the traces came from, as bisect says it: "receipts", "replay of A", "replay of A
// and the aten trace B holds (recorded at golden refresh)", ...
std::string op_source(const TraceRow& a, const TraceRow& b) {
  if (a.from == b.from) {
    switch (a.from) {
      case TraceFrom::kReceipt: return "receipts";
      case TraceFrom::kReplay: return "replay of A and B";
      case TraceFrom::kStored: return "the aten traces A and B hold (recorded at golden refresh)";
    }
  }
  const auto part = [](const TraceRow& row, const char* side) -> std::string {
    switch (row.from) {
      case TraceFrom::kReceipt: return "";
      case TraceFrom::kReplay: return fmt::format("replay of {}", side);
      case TraceFrom::kStored: return fmt::format("the aten trace {} holds (recorded at golden refresh)", side);
    }
    return "";
  };
  const std::string pa = part(a, "A"), pb = part(b, "B");
  return pa.empty() ? pb : pb.empty() ? pa : pa + " and " + pb;
}

DivergentOp op_at(const OpTrace& row, std::size_t c) {
  const receipt::TraceColumn& col = row.columns[c];
  DivergentOp op;
  op.index = col.op_index;
  op.name = col.op;
  op.phase = col.phase;
  op.tensor = col.tensor;
  op.kind = col.kind;
  op.site = c < row.sites.size() ? row.sites[c] : "";
  op.layer = col.layer;
  op.level = row.level;
  for (std::size_t before = 0; before < c; ++before) {
    const receipt::TraceColumn& earlier = row.columns[before];
    if (earlier.op == col.op && earlier.phase == col.phase && earlier.tensor == col.tensor) ++op.occurrence;
  }
  return op;
}

// Within the divergent step: the first op output whose hash differs (bitwise), or whose
// sketch distance leaves the budget the parameters' sketches have at that step.
void find_divergent_op(const ReceiptData& a, const ReceiptData& b, const ComposedBudget& budget,
                       const TraceProvider& replay, Bisection& out) {
  const int s = out.first_divergent_step;
  try {
    const auto [ra, rb] = rows_of(a, b, s, replay);
    out.op_source = op_source(ra, rb);
    // The runs' ops in execution order: where one runs another op than the other (changed
    // code adds, drops or swaps an op), that op is where they part.
    const std::size_t common = std::min(ra.trace.columns.size(), rb.trace.columns.size());
    for (std::size_t c = 0; c <= common; ++c) {
      if (c == common) {
        if (ra.trace.columns.size() == rb.trace.columns.size()) break;
        const bool a_longer = ra.trace.columns.size() > common;
        out.first_divergent_op = op_at(a_longer ? ra.trace : rb.trace, c);
        out.first_divergent_op->other = fmt::format("{} ends its step before this op", a_longer ? "B" : "A");
        return;
      }
      if (ra.trace.columns[c] != rb.trace.columns[c]) {
        out.first_divergent_op = op_at(ra.trace, c);
        const receipt::TraceColumn& other = rb.trace.columns[c];
        out.first_divergent_op->other = fmt::format("B runs {} {} {} here", other.op, other.phase, other.tensor);
        return;
      }
      if (out.bitwise) {
        if (ra.trace.hashes[c] == rb.trace.hashes[c]) continue;
        out.first_divergent_op = op_at(ra.trace, c);
        return;
      }
      const std::size_t w = receipt::kSketchWidth;
      const SketchDistance d = sketch_distance(std::span(ra.trace.projection).subspan(c * w, w),
                                               std::span(rb.trace.projection).subspan(c * w, w));
      const double allowed = budget.allowed("params_sketch", s, d.reference_norm);
      if (!(d.distance > allowed) && !std::isnan(d.distance)) continue;
      out.first_divergent_op = op_at(ra.trace, c);
      out.first_divergent_op->distance = d.distance;
      out.first_divergent_op->allowed = allowed;
      return;
    }
    out.no_op = out.bitwise ? fmt::format("every traced op output of step {} is bitwise equal", s)
                            : fmt::format("no traced op output of step {} leaves the params_sketch budget", s);
  } catch (const TraceUnavailable& e) {
    out.no_op = e.what();
  }
}

// The parent group of a dataset path ("/routing/dropped" -> "/routing").
std::string group_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

// The first step, then the first column, where a decision hash both runs record differs;
// the counts of the same group at that step and column say how many choices moved.
void find_decision_flip(const ReceiptData& a, const ReceiptData& b, Bisection& out) {
  out.decision_records = compared_decision_records(a, b);
  const std::optional<DecisionsPart> part = decisions_part(a, b);
  if (!part) return;
  out.first_decision_flip = DecisionFlip{part->step, part->column, part->hash_dataset, 0, {}};
  DecisionFlip& flip = *out.first_decision_flip;
  for (const auto& [path, series] : a.decisions) {
    const auto other = b.decisions.find(path);
    if (series.record != DecisionRecord::kCount || group_of(path) != group_of(flip.hash_dataset) ||
        other == b.decisions.end() || other->second.columns != series.columns)
      continue;
    const auto c = static_cast<std::size_t>(std::find(series.columns.begin(), series.columns.end(), flip.op) -
                                            series.columns.begin());
    const std::size_t at = static_cast<std::size_t>(flip.step) * series.columns.size() + c;
    const double va = series.values[at], vb = other->second.values[at];
    if (same_bits(va, vb)) continue;
    flip.counts.push_back({path, va, vb});
    flip.moved_at_least += std::fabs(va - vb) / 2;
  }
}

}  // namespace

std::string oracle_verdict(const OracleSide& a, const OracleSide& b) {
  const auto over = [](const char* side, const OracleSide& s) {
    return fmt::format("{} exceeds its bound by {:.3g}x: {}'s op is wrong", side, s.ratio, side);
  };
  if (a.judged && b.judged) {
    if (a.within && b.within) return "both within their bounds: rounding";
    if (!a.within && !b.within) {
      return fmt::format("both exceed their bounds (A {:.3g}x, B {:.3g}x): both ops are wrong", a.ratio, b.ratio);
    }
    return a.within ? over("B", b) : over("A", a);
  }
  if (!a.judged && !b.judged) return fmt::format("neither side is judged (A: {}; B: {})", a.why_not, b.why_not);
  const OracleSide& judged = a.judged ? a : b;
  const char* name = a.judged ? "A" : "B";
  const std::string unjudged = fmt::format("{} is not judged ({})", a.judged ? "B" : "A", a.judged ? b.why_not : a.why_not);
  return judged.within ? fmt::format("{} within its bound; {}", name, unjudged) : over(name, judged) + "; " + unjudged;
}

Bisection bisect(const ReceiptData& a, const ReceiptData& b, const Budgets& budgets, const TraceProvider& replay,
                 const OracleProvider& oracle) {
  check_contracts(a, b);
  Bisection out;
  out.a_path = a.path;
  out.b_path = b.path;
  out.a_lane = a.lane;
  out.b_lane = b.lane;
  out.steps = a.steps();
  const ComposedBudget budget = budget_between(budgets, a, b);
  out.bitwise = budget.bitwise();
  out.budget = budget.names();
  if (out.bitwise) {
    bisect_bitwise(a, b, out);
    // An op output can differ where nothing recorded per step does (the rounding of a
    // later op absorbed it): the traces then name the step.
    const int traced = a.trace && b.trace ? first_trace_step(*a.trace, *b.trace) : -1;
    if (traced >= 0 && (!out.diverged() || traced < out.first_divergent_step)) {
      out.first_divergent_step = traced;
      out.first_divergent_tensor.reset();
      out.first_divergent_metric = "trace";
    }
  } else {
    bisect_budgeted(a, b, budget, out);
  }
  if (out.diverged()) find_divergent_op(a, b, budget, replay, out);
  if (out.first_divergent_op && oracle && !out.first_divergent_op->other.empty()) {
    // The runs part by running different ops (changed code, a fault's own op): no op of
    // both to judge, and the op after it, judged on each side's operands, would say "rounding".
    OracleSide unjudged;
    unjudged.why_not = fmt::format("the runs run different ops here ({})", out.first_divergent_op->other);
    out.oracle = OracleVerdict{unjudged, unjudged,
                               fmt::format("not a question of rounding: {}; the oracle judges an op both runs run",
                                           unjudged.why_not)};
  } else if (out.first_divergent_op && oracle) {
    OracleVerdict v{oracle(a, out.first_divergent_step, *out.first_divergent_op),
                    oracle(b, out.first_divergent_step, *out.first_divergent_op), ""};
    v.verdict = oracle_verdict(v.a, v.b);
    out.oracle = std::move(v);
  }
  find_decision_flip(a, b, out);
  out.equal_steps = out.diverged() ? out.first_divergent_step : out.steps;
  return out;
}

namespace {
nlohmann::json op_json(const Bisection& b) {
  if (!b.first_divergent_op) return nullptr;
  const DivergentOp& op = *b.first_divergent_op;
  nlohmann::json j = {{"index", op.index}, {"name", op.name},     {"layer", op.layer},
                      {"phase", op.phase}, {"tensor", op.tensor}, {"kind", op.kind}, {"level", op.level},
                      {"site", op.site.empty() ? nlohmann::json(nullptr) : nlohmann::json(op.site)},
                      {"other", op.other.empty() ? nlohmann::json(nullptr) : nlohmann::json(op.other)}};
  if (!b.bitwise) {
    j["distance"] = op.distance;
    j["allowed"] = op.allowed;
  }
  return j;
}

nlohmann::json oracle_json(const Bisection& b) {
  if (!b.oracle) return nullptr;
  const auto side = [](const OracleSide& s) -> nlohmann::json {
    if (!s.judged) return {{"judged", false}, {"why_not", s.why_not}};
    return {{"judged", true},         {"within", s.within}, {"error_ulps", s.error_ulps},
            {"bound_ulps", s.bound_ulps}, {"ratio", s.ratio},   {"stored", s.stored},
            {"worst_index", s.worst_index}};
  };
  return {{"a", side(b.oracle->a)}, {"b", side(b.oracle->b)}, {"verdict", b.oracle->verdict}};
}

nlohmann::json decision_json(const Bisection& b) {
  if (b.decision_records.empty()) return nullptr;
  nlohmann::json j = {{"records", b.decision_records}, {"first_flip", nullptr}};
  if (!b.first_decision_flip) return j;
  const DecisionFlip& f = *b.first_decision_flip;
  nlohmann::json counts = nlohmann::json::array();
  for (const DecisionFlip::Count& c : f.counts) counts.push_back({{"dataset", c.dataset}, {"a", c.a}, {"b", c.b}});
  j["first_flip"] = {{"step", f.step}, {"op", f.op}, {"hash_dataset", f.hash_dataset},
                     {"moved_at_least", f.moved_at_least}, {"counts", counts}};
  return j;
}

std::string decision_text(const Bisection& b) {
  if (b.decision_records.empty()) return "";
  if (!b.first_decision_flip) {
    return fmt::format("{:<12}every recorded decision is equal ({})\n", "decisions", fmt::join(b.decision_records, ", "));
  }
  const DecisionFlip& f = *b.first_decision_flip;
  std::vector<std::string> counts;
  for (const DecisionFlip::Count& c : f.counts) counts.push_back(fmt::format("{} {} -> {}", c.dataset, c.a, c.b));
  const std::string moved = f.counts.empty() ? "the same counts, other choices"
                                             : fmt::format("at least {} choice{} moved: {}", f.moved_at_least,
                                                           f.moved_at_least == 1 ? "" : "s", fmt::join(counts, ", "));
  return fmt::format("{:<12}step {}: {} decided otherwise first ({}; {})\n", "decisions", f.step, f.op,
                     f.hash_dataset, moved);
}
}  // namespace

nlohmann::json to_json(const Bisection& b) {
  nlohmann::json tensor = nullptr;
  if (b.first_divergent_tensor) {
    tensor = {{"family", b.first_divergent_tensor->family}, {"tensor", b.first_divergent_tensor->tensor}};
  }
  return {{"version", kBisectJsonVersion},
          {"verdict", b.diverged() ? "diverged" : "equivalent"},
          {"a", {{"path", b.a_path}, {"lane", b.a_lane}}},
          {"b", {{"path", b.b_path}, {"lane", b.b_lane}}},
          {"steps", b.steps},
          {"data", "equal"},
          {"mode", b.bitwise ? "bitwise" : "budget"},
          {"budget", b.budget},
          {"equal_steps", b.equal_steps},
          {"first_divergent_step", b.diverged() ? nlohmann::json(b.first_divergent_step) : nlohmann::json(nullptr)},
          {"first_divergent_metric", b.diverged() ? nlohmann::json(b.first_divergent_metric) : nlohmann::json(nullptr)},
          {"first_divergent_tensor", tensor},
          {"first_divergent_op", op_json(b)},
          {"oracle", oracle_json(b)},
          {"op_trace", b.op_source.empty() ? nlohmann::json(nullptr) : nlohmann::json(b.op_source)},
          {"no_op_reason", b.no_op.empty() ? nlohmann::json(nullptr) : nlohmann::json(b.no_op)},
          {"decisions", decision_json(b)},
          {"deviation", b.bitwise || !b.diverged() ? nlohmann::json(nullptr) : nlohmann::json(b.deviation)},
          {"allowed", b.bitwise || !b.diverged() ? nlohmann::json(nullptr) : nlohmann::json(b.allowed)}};
}

std::string to_text(const Bisection& b) {
  std::string out = fmt::format("{:<12}{} ({})\n{:<12}{} ({})\n{:<12}equal ({} batch hashes)\n", "bisect", b.a_lane,
                                b.a_path, "against", b.b_lane, b.b_path, "data", b.steps);
  const std::string kind = b.bitwise ? "bitwise equal" : fmt::format("within {}", fmt::join(b.budget, " + "));
  if (!b.diverged()) {
    return out + fmt::format("{:<12}steps 0-{} {}: the runs are equivalent\n", "equal", b.steps - 1, kind) +
           decision_text(b);
  }
  if (b.equal_steps > 0) out += fmt::format("{:<12}steps 0-{} {}\n", "equal", b.equal_steps - 1, kind);
  std::string where;
  if (b.first_divergent_tensor) {
    where = fmt::format(" in {} {}", b.first_divergent_tensor->family, b.first_divergent_tensor->tensor);
  }
  out += b.bitwise ? fmt::format("{:<12}step {} differs first{} ({})\n", "diverges", b.first_divergent_step, where,
                                 b.first_divergent_metric)
                   : fmt::format("{:<12}step {} leaves the budget first{}: {} |d| {:.3g} against {:.3g} allowed\n",
                                 "diverges", b.first_divergent_step, where, b.first_divergent_metric, b.deviation, b.allowed);
  if (b.first_divergent_op) {
    const DivergentOp& op = *b.first_divergent_op;
    const std::string layer = op.layer >= 0 ? fmt::format(", layer {}", op.layer) : "";
    const std::string source = b.op_source == "receipts" ? "" : fmt::format("; traced by {}", b.op_source);
    out += fmt::format("{:<12}{} {}{} (op {} of the step, output {} {}{})\n", "first op", op.name, op.phase, layer,
                       op.index, op.kind, op.tensor, source);
    if (!op.site.empty()) out += fmt::format("{:<12}{}\n", "at", op.site);
    if (!op.other.empty()) out += fmt::format("{:<12}{}\n", "", op.other);
    if (!b.bitwise && op.other.empty()) {
      out += fmt::format("{:<12}sketch |d| {:.3g} against {:.3g} allowed\n", "", op.distance, op.allowed);
    }
  } else {
    out += fmt::format("{:<12}unknown: {}\n", "first op", b.no_op);
  }
  if (b.oracle) out += fmt::format("{:<12}{}\n", "oracle", b.oracle->verdict);
  return out + decision_text(b);
}

}  // namespace harness::check
