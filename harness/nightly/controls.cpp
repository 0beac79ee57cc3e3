#include "controls.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bisect.h"
#include "child_process.h"
#include "interrupt.h"
#include "lane_run.h"
#include "receipt/hdf5_file.h"
#include "registry.h"
#include "replay.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json finished(json record, const std::string& status, const std::string& summary,
              std::chrono::steady_clock::time_point start) {
  record["status"] = status;
  record["summary"] = summary;
  record["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return record;
}

bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Every loss, norm and hash equal, bit for bit.
bool bitwise_equal(const check::ReceiptData& a, const check::ReceiptData& b) {
  return same_doubles(a.loss, b.loss) && same_doubles(a.grad_norm, b.grad_norm) && !check::first_moved(a, b);
}

// A Python canary's reference lane run again into `out` by its own command, with `fault` (may
// be empty) and module op traces.
check::ReceiptData run_python_reference(const ControlInputs& in, const std::string& out, const std::string& fault) {
  const LaneSpec& reference = in.matrix.lane(in.matrix.reference);
  std::vector<std::string> argv = expand_command(reference, "", out, in.matrix.steps, in.matrix.seed);
  argv.insert(argv.end(), {"--trace", "ops"});
  if (!fault.empty()) argv.insert(argv.end(), {"--inject-fault", fault});
  std::error_code ignored;
  fs::remove(out, ignored);
  const run::ChildResult child =
      run::run_child(argv, reference.environment, run::ChildOutput::kDiscard, run::ChildOutput::kCapture);
  if (!child.exited_zero()) {
    throw std::runtime_error(
        fmt::format("`{}` {}: {}", command_line(argv), child.how(), run::last_line(child.stderr_tail)));
  }
  return check::load_receipt(out);
}

// The reference lane run again into `out`, with `fault` (may be empty) and op traces.
check::ReceiptData run_reference(const ControlInputs& in, const std::string& out, const std::string& fault) {
  if (in.matrix.lane(in.matrix.reference).python_canary) return run_python_reference(in, out, fault);
  run::RunOptions o = in.matrix.run_options(in.matrix.lane(in.matrix.reference), out);
  o.force = true;
  o.threads = in.threads;
  o.trace = run::TraceLevel::kOps;
  if (!fault.empty()) o.inject_fault = fault;
  o.out = out + ".partial";  // a run cut by a signal leaves no receipt that looks whole
  run::run_canary(o);
  fs::rename(o.out, out);
  return check::load_receipt(out);
}

// A fault that moved the run: its golden check must fail at its step, and bisect (both sides
// traced) must name the faulted op there.
json judge_fault(const ControlInputs& in, const canary::FaultSpec& fault, const check::ReceiptData& faulted,
                 const json& record, std::chrono::steady_clock::time_point start) {
  const std::string what = fmt::format("a {}-ulp fault in {} at step {}", fault.ulps, fault.op, fault.step);
  // The golden check's rules, against this job's clean run of the lane: a reference lane that
  // already fails its golden is that check's regression, not the control's.
  const check::Verdict v = check::compare_receipts(faulted, in.reference, in.budgets, "golden");
  if (v.pass()) {
    return finished(record, "blind",
                    fmt::format("{} passes the golden check of {}: this nightly cannot see a 1-ulp fault", what,
                                in.matrix.lane(in.matrix.reference).lane),
                    start);
  }
  const int failing = v.first_failure()->first_failing_step;
  if (failing != fault.step) {
    return finished(record, "error",
                    fmt::format("{} fails the golden check at step {}, not at the faulted step", what, failing), start);
  }
  const check::ReceiptData clean = in.reference.trace
                                       ? in.reference
                                       : run_reference(in, (fs::path(in.work_dir) / "control-clean.h5").string(), "");
  const check::Bisection b = check::bisect(faulted, clean, in.budgets);
  if (b.first_divergent_step != fault.step || !b.first_divergent_op || b.first_divergent_op->name != fault.op) {
    const std::string said = b.first_divergent_op ? b.first_divergent_op->name : "no op (" + b.no_op + ")";
    return finished(record, "blind",
                    fmt::format("{}: bisect names {} at step {} instead: this nightly cannot find a fault's op", what,
                                said, b.first_divergent_step),
                    start);
  }
  return finished(record, "seen",
                  fmt::format("{} fails the golden check at step {}; bisect names {}", what, failing, fault.op), start);
}

// The fault control: the matrix's faults in order until one moves a recorded bit, which
// judge_fault() judges. A fault the model absorbed (a 1-ulp move of an addend below half an
// ulp of the sum moves nothing) shows nothing either way, so the next one is tried; so is one
// whose faulted run failed (a Python canary's leaf module that its forward never calls, such
// as an embedding kept only to hold a weight that other modules read), its reason kept.
json fault_control(const ControlInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  json record = {{"control", "fault"}, {"fault", ""}, {"absorbed", json::array()}, {"unchecked", json::array()}};
  const LaneSpec& reference = in.matrix.lane(in.matrix.reference);
  if (in.matrix.control_faults.empty()) {
    return finished(record, "skipped", "the matrix names no fault to inject", start);
  }
  if (reference.external() && !reference.python_canary) {
    return finished(record, "skipped",
                    fmt::format("the reference lane {} runs another stack's command, which cannot inject a fault",
                                reference.id),
                    start);
  }
  for (const canary::FaultSpec& fault : in.matrix.control_faults) {
    std::optional<check::ReceiptData> faulted;
    try {
      faulted = run_reference(in, (fs::path(in.work_dir) / "control-fault.h5").string(), fault.to_string());
    } catch (const run::Interrupted&) {
      throw;  // the job's: it reports where the signal landed
    } catch (const std::exception& e) {
      record["unchecked"].push_back(fmt::format("the fault {} could not be checked: {}", fault.to_string(), e.what()));
      continue;
    }
    if (bitwise_equal(*faulted, in.reference)) {
      record["absorbed"].push_back(fault.to_string());
      continue;
    }
    record["fault"] = fault.to_string();
    try {
      return judge_fault(in, fault, *faulted, record, start);
    } catch (const run::Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      const std::string why = fmt::format("the fault {} could not be checked: {}", fault.to_string(), e.what());
      return finished(record, "error", why, start);
    }
  }
  const auto absorbed = record["absorbed"].get<std::vector<std::string>>();
  if (!record["unchecked"].empty()) {
    const auto unchecked = record["unchecked"].get<std::vector<std::string>>();
    return finished(record, "error",
                    fmt::format("{}{}", fmt::join(unchecked, "; "),
                                absorbed.empty() ? std::string()
                                                 : fmt::format("; the others tried ({}) moved no recorded bit",
                                                               fmt::join(absorbed, "; "))),
                    start);
  }
  return finished(record, "error",
                  fmt::format("every fault tried ({}) moved no recorded bit, the model absorbed it: name an op "
                              "whose 1-ulp fault propagates with the matrix's control-fault",
                              fmt::join(absorbed, "; ")),
                  start);
}

// The lanes of the job (not the reference) whose engine sums in a seeded order.
std::vector<std::pair<const LaneSpec*, const check::ReceiptData*>> seeded_lanes(const ControlInputs& in) {
  std::vector<std::pair<const LaneSpec*, const check::ReceiptData*>> out;
  for (const auto& [spec, receipt] : in.lanes) {
    if (spec->external() || spec->id == in.matrix.reference) continue;
    if (make_engine(spec->engine, spec->settings)->reduction_order() == Engine::ReductionOrder::kSeeded) {
      out.emplace_back(spec, receipt);
    }
  }
  return out;
}

// The noise control: a seeded reduction order that came out as the reference's would make
// every noise budget judge nothing.
json noise_control(const ControlInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  const json record = {{"control", "noise"}};
  std::vector<std::string> seen;
  for (const auto& [spec, receipt] : seeded_lanes(in)) {
    if (bitwise_equal(*receipt, in.reference)) {
      return finished(record, "blind",
                      fmt::format("lane {} sums in a seeded order, yet every loss and hash equals the reference "
                                  "lane's: its noise is not applied, and its budget judges nothing",
                                  spec->id),
                      start);
    }
    seen.push_back(spec->id);
  }
  if (seen.empty()) return finished(record, "skipped", "no lane of this job sums in a seeded order", start);
  return finished(record, "seen",
                  fmt::format("{} differ{} bitwise from the reference lane, as a seeded order must",
                              fmt::join(seen, ", "), seen.size() == 1 ? "s" : ""),
                  start);
}

// A copy of `receipt` at `out` whose replay recipe names seed + 1 for the engine's seed flag;
// returns that wrong seed.
std::string with_wrong_seed(const check::ReceiptData& receipt, const std::string& flag, const std::string& out) {
  fs::copy_file(receipt.path, out, fs::copy_options::overwrite_existing);
  const h5::Handle file = h5::open_file(out, true);
  const h5::Handle manifest = h5::open_group(file, "/manifest");
  json recipe = json::parse(h5::read_attr_string(manifest, "run_options"));
  const std::string wrong = std::to_string(std::stoll(recipe.at("engine_options").at(flag).get<std::string>()) + 1);
  recipe["engine_options"][flag] = wrong;
  h5::write_attr(manifest, "run_options", recipe.dump());
  return wrong;
}

// The replay control: a seeded lane replayed under another noise seed must not reproduce its
// receipt; a replay that did would vouch for any order (or the seed moves no bit of the run,
// and the lane's noise judges nothing).
json replay_control(const ControlInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  const json record = {{"control", "replay"}};
  const auto lanes = seeded_lanes(in);
  if (lanes.empty()) return finished(record, "skipped", "no lane of this job sums in a seeded order", start);
  const auto& [spec, receipt] = lanes.front();
  const auto seed = make_engine(spec->engine, spec->settings)->reduction_seed();
  try {
    const std::string copy = (fs::path(in.work_dir) / "control-replay.h5").string();
    const std::string wrong = with_wrong_seed(*receipt, seed->flag, copy);
    run::ReplayOptions o;
    o.receipt = copy;
    o.threads = in.threads;
    const run::ReplayResult r = run::replay(o);
    if (r.reproduced()) {
      return finished(record, "blind",
                      fmt::format("lane {} replayed with --{} {} reproduces its receipt: replay cannot tell its "
                                  "recorded order from another, or the seed moves no bit of the run",
                                  spec->id, seed->flag, wrong),
                      start);
    }
    return finished(record, "seen",
                    fmt::format("lane {} replayed with --{} {} is refused: {} differs at step {}", spec->id, seed->flag,
                                wrong, r.first_mismatch->what, r.first_mismatch->step),
                    start);
  } catch (const run::Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    const std::string why = fmt::format("lane {}'s replay could not be checked: {}", spec->id, e.what());
    return finished(record, "error", why, start);
  }
}

}  // namespace

json run_controls(const ControlInputs& in) {
  json controls = json::array();
  if (in.fault) controls.push_back(fault_control(in));
  controls.push_back(noise_control(in));
  if (const int signal = run::pending_interrupt(); signal != 0) {
    throw run::Interrupted(signal, 0, "the negative controls were interrupted");
  }
  controls.push_back(replay_control(in));
  return controls;
}

bool control_fails_the_job(const json& control) {
  const std::string status = control.at("status");
  return status == "blind" || status == "error";
}

bool controls_fail_the_job(const json& controls) {
  return std::any_of(controls.begin(), controls.end(), [](const json& c) { return control_fails_the_job(c); });
}

json merge_controls(const std::vector<json>& shard_controls) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<json>> by_name;
  for (const json& controls : shard_controls) {
    for (const json& c : controls) {
      const std::string name = c.at("control");
      if (!by_name.count(name)) order.push_back(name);
      by_name[name].push_back(c);
    }
  }
  json merged = json::array();
  for (const std::string& name : order) {
    const std::vector<json>& records = by_name[name];
    const auto first_with = [&](const char* status) {
      return std::find_if(records.begin(), records.end(), [&](const json& c) { return c.at("status") == status; });
    };
    if (auto it = first_with("blind"); it != records.end()) {
      merged.push_back(*it);
    } else if (it = first_with("error"); it != records.end()) {
      merged.push_back(*it);
    } else if (it = first_with("seen"); it != records.end()) {
      json seen = *it;
      std::vector<std::string> summaries;
      double seconds = 0;
      for (const json& c : records) {
        if (c.at("status") != "seen") continue;
        summaries.push_back(c.at("summary"));
        seconds += c.value("seconds", 0.0);
      }
      seen["summary"] = fmt::format("{}", fmt::join(summaries, "; "));
      seen["seconds"] = seconds;
      merged.push_back(seen);
    } else {
      merged.push_back(records.front());
    }
  }
  return merged;
}

}  // namespace harness::nightly
