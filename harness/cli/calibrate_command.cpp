// `harness calibrate --lane L --repeats N`: a proposed budget for one feature from N runs
// of a lane against the reference (or from receipts made elsewhere: `--receipts R.. --reference
// REF`; or from N one-ulp perturbations of its initial weights: `--perturb N`), as a
// candidate budgets file and a report. Fewer than check::kMinCalibrationSamples samples
// (besides those --held-out H holds out of the proposal) without --provisional: exit 2 before
// anything runs. Exit 0 when every repeat, held out or not, fits the proposal (and, with
// --power, the proposal catches a 1e-4 scale of a layer), 1 when not (the proposal needs a
// look), 2 on bad input.
#include <unistd.h>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "calibrate.h"
#include "canary_run.h"
#include "commands.h"
#include "defaults.h"
#include "thread_flag.h"

namespace harness::cli {

void add_calibrate_command(CLI::App& app, CommandRegistry& commands) {
  auto o = std::make_shared<nightly::CalibrateOptions>();
  o->matrix_path = default_matrix();
  o->budgets_path = default_budgets();
  CLI::App* calibrate = app.add_subcommand("calibrate", "Propose a feature's budget from repeated runs of a lane");
  CLI::Option* lane = calibrate->add_option("--lane", o->lane, "Lane id or name in the matrix (runs it here)");
  CLI::Option* receipts =
      calibrate->add_option("--receipts", o->receipts, "Receipts made elsewhere, as the repeats (instead of --lane)")
          ->excludes(lane);
  calibrate->add_option("--reference", o->references,
                        "With --receipts: the receipt or golden they are judged against, or one per receipt in their "
                        "order (pairs; with --perturb: optional)")
      ->needs(receipts);
  calibrate->add_flag("--widen", o->widen, "Never propose less than the current entry (cover another host)");
  CLI::Option* repeats =
      calibrate->add_option("--repeats", o->repeats, "Runs of the lane (fresh noise seeds)")->capture_default_str();
  calibrate->add_flag("--provisional", o->provisional,
                      fmt::format("Write an entry from fewer than {} samples (runs, receipts or perturbed runs); check and "
                                  "the nightly mark it provisional",
                                  check::kMinCalibrationSamples));
  CLI::Option* perturb = calibrate
      ->add_option("--perturb", o->perturb,
                   "N: run the lane (or the one --receipts receipt's recipe) N times with every initial weight moved "
                   "one ulp, and propose from their spread")
      ->check(CLI::Range(1, 1000))
      ->excludes(repeats);
  calibrate->add_option("--perturb-seed-base", o->perturb_seed_base, "Perturbed run i uses seed BASE + i")
      ->capture_default_str()
      ->needs(perturb);
  calibrate->add_option("--held-out", o->held_out,
                        "H: hold the last H samples out of the proposal and count how many fall outside it (the "
                        "entry's false-alarm bound)")
      ->check(CLI::Range(1, 1000));
  CLI::Option* hosts = calibrate->add_option(
      "--hosts", o->hosts,
      "V,...: run the lane's repeats on each emulated host (presets such as aten-avx2, gemm-generic, or VAR=VALUE)");
  calibrate->add_flag("--power", o->power,
                     "With --lane: measure what the lane's check catches under the proposal (harness power), in the report "
                     "and the entry");
  calibrate->add_option("--feature", o->feature, "Feature to propose (default: the lane's most specific)");
  calibrate->add_option("--noise-seed-base", o->noise_seed_base, "Repeat i replays noise seed BASE + i")->capture_default_str();
  calibrate->add_option("--matrix", o->matrix_path, "Lane matrix (TOML)")->capture_default_str();
  calibrate->add_option("--budgets", o->budgets_path, "Current budgets (read only)")->capture_default_str();
  calibrate->add_option("--out", o->out, "Candidate budgets file (default: budgets.candidate.toml beside --budgets)");
  add_threads_flag(*calibrate, o->threads, "Worker threads per run (0 = all cores)");
  commands.add(calibrate, [o, lane, receipts, repeats, hosts] {
    if (hosts->count() > 0 && repeats->count() == 0) o->repeats = 1;  // each host one sample unless --repeats says more
    if (lane->count() == 0 && receipts->count() == 0) {
      throw run::UsageError("--lane or --receipts: name the lane to run here, or the receipts made elsewhere");
    }
    // Progress on a terminal only: in a log, an error stays the one line on stderr.
    const bool tty = isatty(STDERR_FILENO) != 0;
    const nightly::Calibration c = nightly::calibrate(*o, [tty](const std::string& line) {
      if (tty) fmt::print(stderr, "run         {}\n", line);
    });
    fmt::print("{}", nightly::calibration_report(c));
    fmt::print("report      {}\n", c.report_path);
    if (!c.envelope_path.empty()) fmt::print("envelope    {}\n", c.envelope_path);
    if (c.envelope_only) return kExitPass;  // an envelope, nothing proposed
    if (c.provisional()) {
      fmt::print("provisional [{}] from {} sample{} (fewer than {}): check and the nightly say so until it is recalibrated\n",
                 c.section, c.samples, c.samples == 1 ? "" : "s", check::kMinCalibrationSamples);
    }
    if (c.power) {
      fmt::print("power       {}\n", c.power->too_loose().value_or(false) ? "TOO LOOSE under the proposal: misses a 1e-4 scale of a layer "
                                                            "within its run (the report's last section)"
                                                          : "the proposal catches a 1e-4 scale of a layer within its run");
    }
    if (c.held_out > 0) fmt::print("false alarm {}\n", nightly::false_alarm_summary(c));
    if (c.biased()) {
      fmt::print("bias        one-sided drift over the repeats{} (the report's last section)\n",
                 c.bias_fails ? ": the entry says bias = \"fail\"" : ", a warning");
    }
    const bool bias_fails = c.bias_fails && c.biased();
    const bool too_loose = c.power && c.power->too_loose().value_or(false);
    return c.passing_proposed == c.repeats && !bias_fails && !too_loose ? kExitPass : kExitCheckFailed;
  });
}

}  // namespace harness::cli
