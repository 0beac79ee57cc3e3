#include "replay.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>

#include "canary_file.h"
#include "data_source.h"
#include "canary_run.h"
#include "checkpoint.h"
#include "file_io.h"
#include "canary.h"
#include "op_trace.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_validator.h"
#include "run/full_receipt_schema.h"
#include "registry.h"
#include "run_setup.h"
#include "tensor_digest.h"

namespace harness::run {
namespace {

// What the receipt recorded, per step, that a replay must reproduce.
struct Record {
  std::vector<double> loss, grad_norm;
  std::vector<std::uint64_t> batch_hashes;
  std::vector<std::string> tensors;
  std::array<std::vector<std::uint64_t>, 4> hashes;  // kHashFamilies, (steps, tensors)
  std::vector<std::uint64_t> trace;                  // (steps, columns); empty without /trace
  std::vector<std::string> trace_ops, trace_tensors;  // the columns' op and output
};

Record read_record(const receipt::ReceiptReader& r) {
  namespace paths = receipt::paths;
  Record rec{r.f64(paths::kLoss), r.f64(paths::kGradNorm), r.batch_hashes(), r.tensor_names(), {}, {}, {}, {}};
  for (std::size_t f = 0; f < 4; ++f) rec.hashes[f] = r.hashes(receipt::kHashFamilies[f]);
  if (h5::exists(r.file(), paths::kTrace)) {
    rec.trace = h5::read_u64(r.file(), paths::kTraceHash);
    rec.trace_ops = h5::read_strings(r.file(), paths::kTraceOp);
    rec.trace_tensors = h5::read_strings(r.file(), paths::kTraceTensor);
    if (rec.trace_ops.empty() || rec.trace_tensors.size() != rec.trace_ops.size() ||
        rec.trace.size() != rec.loss.size() * rec.trace_ops.size()) {
      throw UsageError(fmt::format("{}: /trace does not hold one row of {} outputs per step; the receipt is damaged",
                                   r.path(), rec.trace_ops.size()));
    }
  }
  return rec;
}

RunOptions recipe_of(const receipt::ReceiptReader& r) {
  const auto manifest = r.manifest_text();
  const auto engine = manifest.find("engine");
  const std::vector<std::string> ours = engine_names();
  if (engine != manifest.end() && std::find(ours.begin(), ours.end(), engine->second) == ours.end()) {
    // Another stack's receipt (the PyTorch lane's engine "torch", a team's own writer): its
    // run_options, if any, are that stack's, and only that stack can run its steps again.
    throw UsageError(fmt::format("{}: written by engine '{}', which the harness does not run ({}); only that "
                                 "stack can run its steps again (to bisect it, record the run with --trace ops)",
                                 r.path(), engine->second, fmt::join(ours, ", ")));
  }
  const auto it = manifest.find("run_options");
  if (it == manifest.end()) {
    throw UsageError(fmt::format("{}: /manifest has no run_options (recorded before replay existed); run the lane "
                                 "again to replay it",
                                 r.path()));
  }
  RunOptions o;
  try {
    o = options_from_recipe(nlohmann::json::parse(it->second));
  } catch (const nlohmann::json::exception&) {
    throw UsageError(fmt::format("{}: /manifest/run_options is not JSON; the receipt is damaged", r.path()));
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: /manifest/{}; the receipt is damaged", r.path(), e.what()));
  }
  // An engine whose reductions are racy draws an order no run can draw again.
  std::unique_ptr<Engine> recorded;
  try {
    recorded = make_engine(o.engine, o.engine_settings);
  } catch (const std::invalid_argument&) {
    return o;  // the replay's run names what is wrong with the settings
  }
  if (recorded->reduction_order() == Engine::ReductionOrder::kRacy) {
    std::vector<std::string> settings;
    for (const auto& [flag, value] : o.engine_settings.options) settings.push_back(flag + "=" + value);
    throw UsageError(fmt::format("{}: engine {} with {} orders its reductions as its threads finish and cannot be "
                                 "replayed; record the lane with a seeded order to replay it",
                                 r.path(), o.engine, fmt::join(settings, ",")));
  }
  return o;
}

// Where a family sits in the receipt's kHashFamilies (params, grads, adam_m, adam_v).
std::size_t hash_family_index(std::string_view family) {
  for (std::size_t f = 0; f < 4; ++f) {
    if (family == receipt::kHashFamilies[f]) return f;
  }
  throw std::logic_error("not a hash family: " + std::string(family));
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The checkpoint at or before `step`, trusted only when its file is the one the receipt
// recorded and its tensors hash to the receipt's record of the step before it.
std::optional<Checkpoint> trusted_checkpoint(const receipt::ReceiptReader& r, const Record& rec, int step,
                                             std::string& path) {
  std::optional<receipt::CheckpointRef> chosen;
  for (const receipt::CheckpointRef& ref : r.checkpoints()) {
    if (ref.step <= step) chosen = ref;
  }
  if (!chosen) return std::nullopt;
  path = chosen->path;
  if (!std::filesystem::exists(path)) {
    throw UsageError(fmt::format("{}: missing; the receipt {} refers to it (keep <receipt>.ckpt/ next to the receipt)",
                                 path, r.path()));
  }
  const std::string content = file_content_hash(path);
  if (content != chosen->content_hash) {
    throw UsageError(fmt::format("{}: content hash {} is not the '{}' the receipt recorded; the checkpoint was altered "
                                 "or replaced, not trusted",
                                 path, content, chosen->content_hash));
  }
  Checkpoint c = load_checkpoint(path);
  const std::string mismatch = c.step != chosen->step   ? fmt::format("holds step {}, not {}", c.step, chosen->step)
                               : c.data_cursor != c.step ? fmt::format("its data cursor {} is not its step {}", c.data_cursor, c.step)
                               : c.names != rec.tensors  ? "holds other tensors than the receipt's"
                                                         : "";
  if (!mismatch.empty()) {
    throw UsageError(fmt::format("{}: {}; not the checkpoint the receipt recorded", path, mismatch));
  }
  const std::size_t K = rec.tensors.size(), row = static_cast<std::size_t>(c.step - 1) * K;
  for (std::size_t f = 0; f < 3; ++f) {
    const std::vector<std::uint64_t>& recorded = rec.hashes[hash_family_index(kCheckpointFamilies[f])];
    for (std::size_t k = 0; k < K; ++k) {
      if (tensor_hash(c.tensors[f][k]) == recorded[row + k]) continue;
      throw UsageError(fmt::format("{}: {} {} does not hash to the receipt's record of step {}; the checkpoint or the "
                                   "receipt was altered, not trusted",
                                   path, kCheckpointFamilies[f], rec.tensors[k], c.step - 1));
    }
  }
  return c;
}

// The first difference between a replayed step and the record of it; nullopt when none.
std::optional<ReplayMismatch> compare_step(const Record& rec, int step, const receipt::StepRecord& got,
                                           const receipt::TraceStep* trace, const std::vector<receipt::TraceColumn>& columns) {
  const auto s = static_cast<std::size_t>(step);
  if (got.batch_hash != rec.batch_hashes[s]) return ReplayMismatch{step, "batch_hash", ""};
  if (trace && !rec.trace.empty()) {
    const std::size_t width = rec.trace_ops.size();
    for (std::size_t c = 0; c < width; ++c) {
      if (columns.size() != width || columns[c].op != rec.trace_ops[c] || columns[c].tensor != rec.trace_tensors[c]) {
        throw UsageError(fmt::format("the receipt's /trace records other ops than this harness traces (column {}); it "
                                     "cannot be verified against them",
                                     c));
      }
      if (trace->hashes[c] != rec.trace[s * width + c]) {
        return ReplayMismatch{step, "trace", columns[c].op + " " + columns[c].phase + " " + columns[c].tensor};
      }
    }
  }
  if (!same_bits(got.loss, rec.loss[s])) return ReplayMismatch{step, "loss", ""};
  if (!same_bits(got.grad_norm, rec.grad_norm[s])) return ReplayMismatch{step, "grad_norm", ""};
  const std::size_t K = rec.tensors.size();
  for (std::size_t f = 0; f < 4; ++f) {
    for (std::size_t k = 0; k < K; ++k) {
      if (got.hashes[f][k] != rec.hashes[f][s * K + k]) return ReplayMismatch{step, receipt::kHashFamilies[f], rec.tensors[k]};
    }
  }
  return std::nullopt;
}

}  // namespace

ReplayResult replay(const ReplayOptions& options) {
  receipt::require_valid_receipt(options.receipt, run::full_receipt_schema());  // its rows are what the replay is checked against
  const receipt::ReceiptReader reader(options.receipt);
  RunOptions o = recipe_of(reader);
  const Record rec = read_record(reader);
  const int recorded = static_cast<int>(rec.loss.size());
  ReplayResult result;
  result.receipt = options.receipt;
  result.lane = reader.manifest_string("lane");
  result.from = options.from;
  result.to = options.to.value_or(recorded - 1);
  if (options.from < 0 || options.from >= recorded) {
    throw UsageError(fmt::format("--from: step {} is not recorded in {} (steps 0-{})", options.from, options.receipt, recorded - 1));
  }
  if (result.to < options.from || result.to >= recorded) {
    throw UsageError(fmt::format("--to: step {} is not in {}-{}", result.to, options.from, recorded - 1));
  }
  canary::CanaryConfig config;
  std::unique_ptr<canary::DataSource> data;
  try {
    config = canary::load_canary(o.canary);
    data = canary::make_data_source(config);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("{}: its canary cannot be loaded to replay it: {}", options.receipt, e.what()));
  }
  if (o.steps) config.steps = *o.steps;
  if (config.to_json().dump() != reader.manifest_string("canary")) {
    throw UsageError(fmt::format("{}: canary {} changed since the receipt was recorded; it cannot be replayed by "
                                 "this harness",
                                 options.receipt, o.canary));
  }
  const int threads = options.threads > 0 ? options.threads : o.threads > 0 ? o.threads : 0;
  std::optional<tbb::global_control> limit;
  if (threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  std::optional<canary::FaultSpec> fault;
  std::unique_ptr<Engine> engine;
  const std::unique_ptr<canary::Canary> probe = canary::make_canary(config);
  try {  // the recipe's fault and engine, checked as run checks its flags: named as the recipe's
    if (o.inject_fault) {
      fault = canary::parse_fault_spec(*o.inject_fault, probe->forward_op_names(), probe->parameter_names());
    }
    engine = make_engine(o.engine, o.engine_settings);
  } catch (const std::invalid_argument& e) {
    // e.what() names the run flag the recipe key stands for (--engine, --features, ...).
    throw UsageError(fmt::format("{}: /manifest/run_options holds what `harness run` refuses ({}); the receipt is "
                                 "damaged",
                                 options.receipt, e.what()));
  }
  const bool tracing = options.trace_ops || !rec.trace.empty();
  const RunSetup setup = set_up_run(config, std::move(engine), {fault, tracing});
  const canary::Canary& model = *setup.model;
  Engine* const replaying = setup.engine.get();
  const std::optional<Checkpoint> checkpoint = trusted_checkpoint(reader, rec, options.from, result.checkpoint);
  if (checkpoint) {
    restore_checkpoint(*checkpoint, *replaying, model);
    result.resumed_from = checkpoint->step;
  } else {
    upload_initial_parameters(setup, static_cast<std::uint64_t>(o.seed.value_or(config.init_seed)), init_perturbation(o));
  }
  OpTraceRecorder tracer(model.tensors());
  if (tracing) replaying->set_trace_sink(&tracer);
  std::optional<OpOracle> oracle;
  if (options.oracle_step >= 0) {
    if (options.oracle_step < options.from || options.oracle_step > result.to) {
      throw UsageError(fmt::format("--step: step {} is not replayed ({}-{})", options.oracle_step, options.from, result.to));
    }
    try {
      oracle.emplace(*replaying, model.tensors(), options.oracle_against);
      if (!options.capture_site.empty()) oracle->capture(options.capture_site, options.capture_phase);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", options.receipt, e.what()));
    }
  }

  const auto start = std::chrono::steady_clock::now();
  const StepDigester digester(model);
  receipt::StepRecord got;
  for (int step = result.resumed_from; step <= result.to; ++step) {
    setup.model->set_op_observer(oracle && step == options.oracle_step ? &*oracle : nullptr);
    take_step(setup, *data, step, digester, got);
    setup.model->set_op_observer(nullptr);
    if (tracing) result.trace.push_back(tracer.finish_step());
    const std::optional<ReplayMismatch> mismatch =
        compare_step(rec, step, got, tracing ? &result.trace.back() : nullptr, tracer.columns());
    if (mismatch) {
      if (!result.first_mismatch) result.first_mismatch = mismatch;
      result.mismatched_steps.push_back(step);
    }
    if (checkpoint && step == result.resumed_from && tracing == (o.trace == TraceLevel::kOps)) {
      for (const auto& [fact, value] : replaying->save_state().facts) {
        const auto saved = checkpoint->engine.facts.find(fact);
        if (saved != checkpoint->engine.facts.end() && saved->second != value) {
          result.notes.push_back(fmt::format("{} differs from the checkpoint's ({} now, {} then)", fact, value, saved->second));
        }
      }
    }
  }
  result.steps_run = result.to - result.resumed_from + 1;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.trace_columns = tracer.columns();
  result.record_altered = !result.mismatched_steps.empty() && result.mismatched_steps.back() < result.to;
  if (oracle) {
    result.oracle = oracle->report();
    result.captured = oracle->captured();
  }
  return result;
}

}  // namespace harness::run
