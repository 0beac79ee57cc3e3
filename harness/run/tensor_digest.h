// Per-tensor digests recorded every step (receipt/digest.h), for every tensor of a model.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "api/engine.h"
#include "canary.h"
#include "receipt/digest.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

// The per-tensor digests live with the receipt library (installed for C++ users).
using receipt::tensor_hash;
using receipt::TensorSketcher;

// Digests every step of one model: hashes of params, grads, adam_m, adam_v and sketches
// of params and grads, for every parameter in canonical order, tensors in parallel.
class StepDigester {
 public:
  explicit StepDigester(const canary::Canary& model);
  void digest(Engine& engine, receipt::StepRecord& record) const;

 private:
  const canary::Canary& model_;
  std::vector<TensorSketcher> sketchers_;  // one per parameter (grads share the layout)
};

}  // namespace harness::run
