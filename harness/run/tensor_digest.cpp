#include "tensor_digest.h"

#include <tbb/parallel_for.h>

namespace harness::run {

StepDigester::StepDigester(const canary::Canary& model) : model_(model) {
  for (TensorId p : model.parameters()) {
    const TensorDesc& d = model.tensors()[p];
    sketchers_.emplace_back(static_cast<std::size_t>(d.numel()), receipt::sketch_salt(d.name.c_str()));
  }
}

void StepDigester::digest(Engine& engine, receipt::StepRecord& record) const {
  const TensorTable& table = model_.tensors();
  const auto& params = model_.parameters();
  const TensorKind families[4] = {TensorKind::Parameter, TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV};
  std::vector<std::span<const float>> views;  // read() is a host sync: do it before going parallel
  for (TensorKind kind : families) {
    for (TensorId p : params) views.push_back(engine.read(kind == TensorKind::Parameter ? p : table.shadow(p, kind)));
  }
  const std::size_t K = params.size();
  for (auto& h : record.hashes) h.assign(K, 0);
  for (auto& s : record.sketches) s.assign(K, {});
  tbb::parallel_for(std::size_t{0}, 4 * K, [&](std::size_t i) {
    const std::size_t family = i / K, k = i % K;
    record.hashes[family][k] = tensor_hash(views[i]);
    if (family < 2) record.sketches[family][k] = sketchers_[k](views[i]);
  });
}

}  // namespace harness::run
