#include "invariance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <tbb/global_control.h>

#include "canary.h"
#include "canary_run.h"
#include "data_source.h"
#include "numerics/det_math.h"
#include "numerics/philox.h"
#include "registry.h"
#include "run_setup.h"

namespace harness::run {
namespace {

using canary::Batch;
using canary::CanaryConfig;

// One traced forward output: the rows that belong to the sequence.
struct TracedRows {
  std::string op, tensor;
  int layer = -1;
  std::vector<float> rows;
};

// What the comparisons need of every run: the tensors whose leading dimension grows with
// the batch (found by comparing the tables of one and of two sequences: never by name),
// and each one's elements per sequence.
struct BatchLayout {
  std::vector<std::int64_t> per_sequence;  // by tensor id; 0: not batch-major
};

BatchLayout batch_layout(const CanaryConfig& config) {
  CanaryConfig one = config, two = config;
  one.batch_size = 1;
  two.batch_size = 2;
  const auto a = canary::make_canary(one), b = canary::make_canary(two);
  const TensorTable &ta = a->tensors(), &tb = b->tensors();
  BatchLayout layout;
  layout.per_sequence.assign(ta.size(), 0);
  for (std::size_t i = 0; i < ta.size(); ++i) {
    const TensorDesc &da = ta[static_cast<TensorId>(i)], &db = tb[static_cast<TensorId>(i)];
    if (da.rank() > 0 && db.rank() == da.rank() && db.dim(0) == 2 * da.dim(0)) layout.per_sequence[i] = da.numel();
  }
  return layout;
}

// Keeps, of each traced forward output whose tensor is batch-major, the sequence's rows.
class SequenceRows : public TraceSink {
 public:
  SequenceRows(const TensorTable& table, const BatchLayout& layout, int position)
      : table_(table), layout_(layout), position_(position) {}
  void on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) override {
    const std::int64_t n = layout_.per_sequence.at(static_cast<std::size_t>(tensor));
    if (site.phase != Phase::Forward || n == 0) return;
    // A tensor whose other dimensions grow with the batch too (moe's capacity) has no rows of
    // one sequence's size: only those whose value is whole rows of it are compared.
    if (value.size() % static_cast<std::size_t>(n) != 0 ||
        value.size() < static_cast<std::size_t>((position_ + 1) * n)) {
      return;
    }
    const auto rows = value.subspan(static_cast<std::size_t>(position_ * n), static_cast<std::size_t>(n));
    traced_.push_back({std::string(site.name), table_[tensor].name, site.layer, {rows.begin(), rows.end()}});
  }
  std::vector<TracedRows> take() { return std::move(traced_); }

 private:
  const TensorTable& table_;
  const BatchLayout& layout_;
  int position_;
  std::vector<TracedRows> traced_;
};

struct SequenceRun {
  std::vector<TracedRows> traced;
  std::vector<float> logits;  // (T, V) of the sequence: its last traced value
};

struct Setup {
  CanaryConfig config;
  std::int64_t seed = 0;
  std::vector<std::int32_t> sequence;              // T+1 tokens
  std::vector<std::vector<std::int32_t>> others;  // the other rows, T+1 tokens each
  BatchLayout layout;
};

// The canary's data: the sequence is batch 0's first row; the others, the rows after it.
Setup make_setup(const InvarianceOptions& o) {
  Setup s;
  s.config = load_run_canary(o.canary);
  s.seed = o.seed.value_or(s.config.init_seed);
  if (s.seed < 0) throw UsageError("--seed: must be between 0 and 9223372036854775807");
  check_engine_can_run(o.engine, o.engine_settings, *canary::make_canary(s.config));  // the settings themselves
  for (const int batch : {1, o.max_batch}) {  // the sequence alone, and the largest batch, on this engine
    CanaryConfig sized = s.config;
    sized.batch_size = batch;
    try {
      check_engine_can_run(o.engine, o.engine_settings, *canary::make_canary(sized));
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{} (the check runs batches of 1 to {})", e.what(), o.max_batch));
    }
  }
  std::shared_ptr<const canary::DataSource> data;
  try {
    data = canary::make_data_source(s.config);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
  const std::size_t row = static_cast<std::size_t>(s.config.context_length) + 1;
  for (int step = 0; static_cast<int>(s.others.size()) < o.max_batch - 1 || s.sequence.empty(); ++step) {
    const Batch b = data->batch(step);
    for (int r = 0; r < b.batch_size; ++r) {
      std::vector<std::int32_t> tokens(b.tokens.begin() + static_cast<std::ptrdiff_t>(r * row),
                                       b.tokens.begin() + static_cast<std::ptrdiff_t>((r + 1) * row));
      (s.sequence.empty() ? s.sequence : s.others.emplace_back()) = std::move(tokens);
    }
  }
  s.layout = batch_layout(s.config);
  return s;
}

SequenceRun run_batch(const InvarianceOptions& o, const Setup& s, int batch, int position) {
  CanaryConfig config = s.config;
  config.batch_size = batch;
  const RunSetup setup = set_up_run(config, make_engine(o.engine, o.engine_settings), {std::nullopt, /*trace_ops=*/true});
  upload_initial_parameters(setup, static_cast<std::uint64_t>(s.seed));
  const std::unique_ptr<canary::Canary>& model = setup.model;
  Engine* const engine = setup.engine.get();
  std::vector<std::int32_t> tokens;
  for (int r = 0, other = 0; r < batch; ++r) {
    const std::vector<std::int32_t>& row = r == position ? s.sequence : s.others.at(static_cast<std::size_t>(other++));
    tokens.insert(tokens.end(), row.begin(), row.end());
  }
  SequenceRows sink(model->tensors(), s.layout, position);
  engine->set_trace_sink(&sink);
  model->evaluate_loss(*engine, 0, canary::assemble_batch(0, batch, config.context_length, std::move(tokens)));
  engine->set_trace_sink(nullptr);
  SequenceRun run{sink.take(), {}};
  const std::string& logits = model->tensors()[model->token_logits()].name;
  for (const TracedRows& t : run.traced) {
    if (t.tensor == logits) run.logits = t.rows;
  }
  if (run.logits.empty()) throw std::logic_error("invariance: the forward traced no logits");
  return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// log p(target) per token of the sequence: the log-softmax of its logits in double (a
// report's number, not a recorded bit; det_math, so it reads the same on every machine).
std::vector<double> target_logprobs(const std::vector<float>& logits, const std::vector<std::int32_t>& sequence) {
  const std::size_t T = sequence.size() - 1, V = logits.size() / T;
  std::vector<double> out(T);
  for (std::size_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    const double top = *std::max_element(row, row + V);
    double sum = 0;
    for (std::size_t v = 0; v < V; ++v) sum += numerics::det_exp(static_cast<double>(row[v]) - top);
    out[t] = static_cast<double>(row[static_cast<std::size_t>(sequence[t + 1])]) - top - numerics::det_log(sum);
  }
  return out;
}

InvarianceCheck compare(int batch, int position, const SequenceRun& alone, const SequenceRun& run,
                        const std::vector<std::int32_t>& sequence) {
  InvarianceCheck c{batch, position, true, 0.0, "", -1, ""};
  const std::vector<double> a = target_logprobs(alone.logits, sequence), b = target_logprobs(run.logits, sequence);
  for (std::size_t t = 0; t < a.size(); ++t) {
    c.max_logprob_delta = std::max(c.max_logprob_delta, std::fabs(a[t] - b[t]));
  }
  for (std::size_t i = 0; i < std::min(alone.traced.size(), run.traced.size()); ++i) {
    const TracedRows &x = alone.traced[i], &y = run.traced[i];
    if (x.op == y.op && x.tensor == y.tensor && same_bits(x.rows, y.rows)) continue;
    c.bitwise = false;
    c.first_op = y.op;
    c.first_op_layer = y.layer;
    c.first_tensor = y.tensor;
    break;
  }
  if (alone.traced.size() != run.traced.size()) c.bitwise = false;  // another graph: never the same run
  return c;
}

}  // namespace

std::optional<int> InvarianceReport::smallest_breaking() const {
  for (const InvarianceCheck& c : checks) {
    if (!c.bitwise) return c.batch_size;
  }
  return std::nullopt;
}

InvarianceReport check_batch_invariance(const InvarianceOptions& o) {
  if (o.max_batch < 2 || o.max_batch > 64) throw UsageError("--max-batch: must be in 2..64");
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism,
                                    static_cast<std::size_t>(worker_threads(o.threads)));
  const Setup s = make_setup(o);
  const std::unique_ptr<Engine> named = make_engine(o.engine, o.engine_settings);
  InvarianceReport report{lane_name(s.config.name, named->lane_engine(), named->features()),
                          s.config.context_length, {}, std::nullopt};
  // A seeded reduction order is drawn once and pinned for every run: the runs differ only
  // in where the sequence sits, never in the seed (an engine made per run would draw anew).
  InvarianceOptions pinned = o;
  if (const std::optional<Engine::ReductionSeed> seed = named->reduction_seed()) {
    pinned.engine_settings.options[std::string(seed->flag)] = std::to_string(seed->seed);
    report.reduction_seed = seed->seed;
  }
  const SequenceRun alone = run_batch(pinned, s, 1, 0);
  const std::uint64_t stream = numerics::stream_id("invariance/position");
  for (int batch = 2; batch <= o.max_batch; ++batch) {
    const std::uint32_t draw = numerics::philox_at(o.position_seed, stream, static_cast<std::uint64_t>(batch))[0];
    const int position = static_cast<int>(draw % static_cast<std::uint32_t>(batch));
    report.checks.push_back(compare(batch, position, alone, run_batch(pinned, s, batch, position), s.sequence));
  }
  return report;
}

nlohmann::json to_json(const InvarianceReport& r) {
  nlohmann::json checks = nlohmann::json::array();
  for (const InvarianceCheck& c : r.checks) {
    checks.push_back({{"batch_size", c.batch_size},
                      {"position", c.position},
                      {"bitwise", c.bitwise},
                      {"max_logprob_delta", c.max_logprob_delta},
                      {"first_op", c.first_op.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.first_op)},
                      {"first_op_layer", c.first_op_layer},
                      {"first_tensor",
                       c.first_tensor.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.first_tensor)}});
  }
  const std::optional<int> smallest = r.smallest_breaking();
  return {{"lane", r.lane},
          {"sequence_tokens", r.sequence_tokens},
          {"reduction_seed", r.reduction_seed ? nlohmann::json(*r.reduction_seed) : nlohmann::json(nullptr)},
          {"invariant", !smallest.has_value()},
          {"smallest_breaking_batch", smallest ? nlohmann::json(*smallest) : nlohmann::json(nullptr)},
          {"checks", checks}};
}

std::string to_text(const InvarianceReport& r) {
  std::string out = fmt::format("invariance  {}: one sequence of {} tokens alone, then at a drawn row of batches of "
                                "2..{}{}\n",
                                r.lane, r.sequence_tokens, r.checks.empty() ? 1 : r.checks.back().batch_size,
                                r.reduction_seed ? fmt::format(" (reduction order seed {} for every run)",
                                                               *r.reduction_seed)
                                                 : "");
  for (const InvarianceCheck& c : r.checks) {
    out += fmt::format("batch {:>2} row {:>2}  ", c.batch_size, c.position);
    if (c.bitwise) {
      out += "bitwise\n";
      continue;
    }
    out += fmt::format("differs: max |d log p| {:.3g}", c.max_logprob_delta);
    if (!c.first_op.empty()) out += fmt::format("; first at op {} (output {})", c.first_op, c.first_tensor);
    out += '\n';
  }
  const std::optional<int> smallest = r.smallest_breaking();
  if (!smallest) return out + "verdict     batch-invariant: bitwise for every batch size\n";
  const InvarianceCheck& first = r.checks.at(static_cast<std::size_t>(*smallest - 2));
  return out + fmt::format("verdict     not batch-invariant: smallest breaking batch size {}{}\n", *smallest,
                           first.first_op.empty() ? "" : fmt::format(", first at op {}", first.first_op));
}

}  // namespace harness::run
