// `harness calibrate`: proposes one feature's budget from repeated runs of a lane against
// the reference lane (docs/budgets.md, "Calibration"). It writes a candidate budgets file
// and a report; the budgets file itself is never touched.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "budgets.h"
#include "drift_bias.h"
#include "power.h"

namespace harness::nightly {

struct CalibrateOptions {
  std::string matrix_path, budgets_path;
  std::string lane;     // id or lane name in the matrix
  std::string feature;  // "" : the lane's most specific feature (fp8-limited, fp8, mesh-bf16, bf16, mesh-fp32, noise)
  int repeats = check::kMinCalibrationSamples;
  // Write an entry from fewer than kMinCalibrationSamples samples, which then reads as
  // provisional (check and the nightly say so); without it calibrate refuses, exit 2.
  bool provisional = false;
  std::int64_t noise_seed_base = 1000;  // repeat i of a seeded lane replays noise seed base + i
  std::string out;      // candidate budgets file ("" : budgets.candidate.toml beside the budgets)
  int threads = 0;
  // From receipts instead of runs: the repeats are these receipts (written anywhere: another
  // host, a GPU farm, a real stack), judged against `references`: one receipt or golden for
  // all of them, or one per receipt, in order (pairs: each receipt against the run made
  // beside it, e.g. a ddp run against the one-process run of the same initial weights on the
  // same host). `lane` and the matrix are then not used.
  std::vector<std::string> receipts;
  std::vector<std::string> references;
  // Never propose less than the current entry: cover a new host's drift without losing the
  // hosts the entry was calibrated on.
  bool widen = false;
  // --perturb N: perturbation calibration (docs/budgets.md). The lane (or the one receipt's
  // recipe) runs again N times, run i with every initial weight moved one ulp under seed
  // perturb_seed_base + i; their spread is the envelope, and with a reference the
  // unperturbed run and the N perturbed ones are the repeats the proposal is made from.
  int perturb = 0;
  std::int64_t perturb_seed_base = 1;
  // --held-out H: the last H samples (repeats, receipts or perturbed runs) are held out of the
  // proposal and only checked against it; how many fall outside bounds the entry's
  // false-alarm rate (check/false_alarm.h, docs/budgets.md "False alarms").
  int held_out = 0;
  // --power (with --lane): the lane's detection power under the candidate (power.h), in the
  // report: whether the proposal is too loose.
  bool power = false;
  // --hosts V,...: the lane's repeats run on each emulated host in turn (host_variants.h);
  // each run is a sample, so `repeats` counts per host. "": this host as it is.
  std::string hosts;
};

// How far N one-ulp perturbations of a run's initial weights spread, step by step: what a
// bitwise-irrelevant change is entitled to. Per metric (kBudgetMetrics), per step.
struct PerturbationEnvelope {
  std::vector<std::int64_t> seeds;
  std::map<std::string, std::vector<double>> spread;  // the largest |perturbed - unperturbed| over the N runs (and tensors)
  std::map<std::string, std::vector<double>> drift;   // |unperturbed - reference| (and over tensors); empty: no reference
};

// Each repeat's verdict under the current budgets and under the proposal, in one line each.
struct RepeatOutcome {
  std::string label;  // the receipt's path, or "unperturbed" / "perturb seed S"
  bool passes_now = false, passes_proposed = false;
  bool held_out = false;  // not among the samples the proposal was made from
  std::string now, proposed;  // why: "pass (least headroom 31%, loss)", "FAIL loss at step 3: ...", "no entry for ..."
};

struct WindowProposal {
  std::string metric;
  check::Window current, proposed;
  double observed = 0;       // the largest |deviation| in the window over all repeats
  double needed_scale = 0;   // of the current window, once the other features' share is taken off
  double margin = 0;         // the proposal over the largest need (check/margin.h); 0: nothing measured
  int samples = 0;           // deviations in the window over all repeats; 0: proposed = current
  int margin_samples = 0;    // the repeats the margin was read from (check/margin.h)
};

struct Calibration {
  std::string lane, reference, feature;
  std::string section;                // its entry's table, replaced in the candidate: "bf16" or "tiny.bf16"
  bool new_entry = false;             // the budgets had no entry for it: the candidate adds one
  std::vector<std::string> composed;  // every declared feature the comparison budgets; `feature` is the one proposed
  std::vector<std::int64_t> noise_seeds;  // per repeat; empty when the lane has no seeded noise
  std::vector<WindowProposal> windows;
  // The metrics proposed: kBudgetMetrics, and kEvalMetrics when the runs and the reference
  // evaluated a held-out batch (docs/logit-kl.md).
  std::vector<std::string> metrics;
  std::map<std::string, double> observed;  // per metric, over all windows
  int repeats = 0, passing_now = 0, passing_proposed = 0;
  // Independent deviations from the reference the entry rests on (the candidate's `samples`):
  // the repeats, but the perturbed runs only under --perturb (the unperturbed one is not
  // independent of them).
  int samples = 0;
  bool provisional() const { return samples < check::kMinCalibrationSamples; }
  // Samples held out of the proposal (besides `samples`), and how many the proposal fails.
  int held_out = 0, held_out_outside = 0;
  std::string candidate_path, report_path;
  std::string source;  // where the repeats came from: "runs", or the receipts' paths
  bool paired = false;  // receipts each judged against its own reference (--reference per receipt)
  bool widened = false;
  std::vector<RepeatOutcome> outcomes;
  std::optional<PerturbationEnvelope> envelope;  // --perturb
  bool envelope_only = false;  // --perturb of the reference itself (or with no reference): nothing to propose
  std::string envelope_path;   // the envelope as JSON, beside the report
  // One-sided drift over the repeats, per signed metric and proposed window; a biased one
  // fails the calibration where the entry says bias = "fail".
  std::vector<check::DriftBias> bias;
  bool bias_fails = false;
  bool biased() const;
  std::optional<PowerReport> power;  // --power: measured under the candidate
  // --hosts: the variants the samples ran under; and the real CPUs (receipts' `cpu`) of every
  // sample, however made: what the entry records it was checked across.
  std::vector<std::string> host_variants, host_cpus;
};

// Runs the reference once and the lane `repeats` times (or reads options.receipts and
// options.reference; or, with options.perturb, runs the lane or receipt's recipe N times
// perturbed), proposes, writes the candidate and the report (and the envelope's JSON). Throws MatrixError /
// check::BudgetError / run::UsageError / receipt::ReceiptError on bad input.
// The entry's record of a lane's power, as `calibrate --power` writes it under the entry:
// `power = { lane = ..., step = ..., tensor = ..., weight_scale = ..., ... }`, per ladder the
// smallest size caught or "none up to" its largest; "" when no ladder was climbed (the clean
// lane failed its check). `harness power` prints it too, for an entry measured on its own.
std::string power_record(const PowerReport& report);

Calibration calibrate(const CalibrateOptions& options, const std::function<void(const std::string&)>& progress = {});

std::string calibration_report(const Calibration& calibration);

// "0 of 16 held-out samples outside the proposal: false-alarm rate below 17.1% at 95%
// confidence; below 5% needs 59 held out, none outside"; "" when none were held out.
std::string false_alarm_summary(const Calibration& calibration);

}  // namespace harness::nightly
