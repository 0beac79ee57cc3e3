// Runs a canary into a scratch receipt and reads back the bits the determinism contracts
// talk about: losses, grad norms, batch hashes and the four hash families.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "canary_run.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "scratch_dir.h"

namespace harness::testing {

struct ReceiptBits {
  std::vector<double> loss, grad_norm;
  std::vector<std::uint64_t> batches, params, grads, m, v;
  std::string noise_seed;  // the manifest attribute as text ("" when absent)
  bool same_numbers(const ReceiptBits& o) const {
    return loss == o.loss && grad_norm == o.grad_norm && batches == o.batches && params == o.params &&
           grads == o.grads && m == o.m && v == o.v;
  }
};

inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

// Runs `options` (its out and force are set here) and reads the receipt back.
inline ReceiptBits run_and_read(run::RunOptions options, const std::string& tag) {
  options.out = scratch().path(tag + ".h5");
  options.force = true;
  run::run_canary(options);
  const receipt::ReceiptReader r(options.out);
  ReceiptBits bits{r.f64(harness::receipt::paths::kLoss), r.f64(harness::receipt::paths::kGradNorm), r.batch_hashes(), r.hashes("params"),
                   r.hashes("grads"),   r.hashes("adam_m"),       r.hashes("adam_v"), {}};
  const auto manifest = r.manifest_text();
  if (manifest.count("noise_seed")) bits.noise_seed = manifest.at("noise_seed");
  return bits;
}

inline run::RunOptions lane(const std::string& canary, int steps, int threads, const std::string& engine = "cpu-ref",
                            const std::string& features = "", std::map<std::string, std::string> flags = {}) {
  run::RunOptions o;
  o.canary = canary;
  o.steps = steps;
  o.threads = threads;
  o.engine = engine;
  o.engine_settings = {features, std::move(flags)};
  return o;
}

// One dataset of the scratch receipt run_and_read() wrote under `tag`, as doubles.
inline std::vector<double> receipt_dataset(const std::string& tag, const std::string& path) {
  const receipt::ReceiptReader r(scratch().path(tag + ".h5"));
  return h5::read_f64(r.file(), path);
}

// The largest |loss a - loss b| over the steps.
inline double max_loss_gap(const ReceiptBits& a, const ReceiptBits& b) {
  double gap = 0;
  for (std::size_t s = 0; s < a.loss.size(); ++s) gap = std::max(gap, std::fabs(a.loss[s] - b.loss[s]));
  return gap;
}

}  // namespace harness::testing
