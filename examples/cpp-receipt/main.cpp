// A toy training loop of your own (a bigram softmax model, Adam, fp32 on the CPU) that
// records a receipt with CanaryHarness::receipt: docs/cpp.md walks through it.
//   cpp_receipt OUT.h5      exit 0: OUT.h5 written, `harness validate OUT.h5` passes
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include <canary_harness/numerics/philox.h>
#include <canary_harness/receipt/digest.h>
#include <canary_harness/receipt/receipt_writer.h>

namespace receipt = harness::receipt;
namespace numerics = harness::numerics;

int main(int argc, char** argv) try {
  if (argc != 2) { std::fprintf(stderr, "usage: %s OUT.h5\n", argv[0]); return 2; }
  constexpr int V = 16, B = 4, T = 8, kSteps = 8;
  constexpr float kLr = 0.1f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
  constexpr std::int64_t kSeed = 1234;
  const std::vector<std::string> names = {"bigram.weight", "bigram.bias"};  // the receipt's tensor order
  std::vector<std::vector<float>> params = {std::vector<float>(V * V), std::vector<float>(V, 0.0f)};
  for (std::size_t i = 0; i < params[0].size(); ++i) {  // N(0, 0.02^2) from the seed, by name
    params[0][i] = static_cast<float>(0.02 * numerics::normal_at(kSeed, numerics::stream_id(names[0].c_str()), i));
  }
  auto grads = params, adam_m = params, adam_v = params;
  for (auto* family : {&adam_m, &adam_v}) for (auto& t : *family) std::fill(t.begin(), t.end(), 0.0f);

  receipt::Manifest m;  // every attribute `harness validate` requires (docs/receipt-schema.md)
  m.lane = "toy-bigram/cpp-example";
  m.engine = "cpp-example";
  m.features = "";
  m.canary_json = R"({"preset": "toy-bigram", "vocab": 16, "batch": 4, "seq": 8, "optimizer": "adam", "lr": 0.1, "steps": 8})";
  m.seed = kSeed;
  m.steps_planned = kSteps;
  m.threads = 1;
  char when[32], host[256] = "unknown";
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  gethostname(host, sizeof host - 1);
  m.created_utc = when;
  m.git_commit = "unknown";  // your training code's commit
  m.toolchain = CPP_RECEIPT_TOOLCHAIN;  // compiler, version, build type (CMakeLists.txt)
  m.libraries = "canary-harness receipt " CANARY_HARNESS_VERSION ", " H5_VERS_INFO;
  m.host = host;
  m.cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.starts_with("model name")) { m.cpu = line.substr(line.find(':') + 2); break; }
  }
  // Declared, never inferred: what separates this run from the bitwise reference, by the
  // names of canaries/budgets.toml ("" for none; e.g. "torch-bf16" for a bf16 PyTorch lane).
  m.extra["budget_features"] = std::string("");

  harness::h5::silence_library_errors();  // HDF5's failures come back as exceptions naming the file
  receipt::ReceiptWriter writer(argv[1], m, names, /*overwrite=*/false, /*record_batches=*/true, {B, T + 1});
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::int32_t> tokens(B * (T + 1));  // row r: a rule the model can learn
    for (int r = 0; r < B; ++r) {
      tokens[r * (T + 1)] = (step * B + r) % V;
      for (int t = 1; t <= T; ++t) tokens[r * (T + 1) + t] = (5 * tokens[r * (T + 1) + t - 1] + 3) % V;
    }
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    float loss = 0;
    for (int r = 0; r < B; ++r) {
      for (int t = 0; t < T; ++t) {  // softmax cross-entropy of the next token, mean over B*T
        const int in = tokens[r * (T + 1) + t], target = tokens[r * (T + 1) + t + 1];
        float logits[V], top = -INFINITY, total = 0;
        for (int v = 0; v < V; ++v) top = std::max(top, logits[v] = params[0][in * V + v] + params[1][v]);
        for (int v = 0; v < V; ++v) total += logits[v] = std::exp(logits[v] - top);
        loss -= std::log(logits[target] / total) / (B * T);
        for (int v = 0; v < V; ++v) {
          const float d = (logits[v] / total - (v == target ? 1.0f : 0.0f)) / (B * T);
          grads[0][in * V + v] += d;
          grads[1][v] += d;
        }
      }
    }
    double norm2 = 0;
    for (const auto& g : grads) for (float x : g) norm2 += double{x} * x;
    const float c1 = 1 - std::pow(kBeta1, static_cast<float>(step + 1)), c2 = 1 - std::pow(kBeta2, static_cast<float>(step + 1));
    for (std::size_t k = 0; k < params.size(); ++k) {  // Adam
      for (std::size_t i = 0; i < params[k].size(); ++i) {
        const float g = grads[k][i];
        adam_m[k][i] = kBeta1 * adam_m[k][i] + (1 - kBeta1) * g;
        adam_v[k][i] = kBeta2 * adam_v[k][i] + (1 - kBeta2) * g * g;
        params[k][i] -= kLr * (adam_m[k][i] / c1) / (std::sqrt(adam_v[k][i] / c2) + kEps);
      }
    }

    // The step's row: loss, grad norm, lr, the batch, then every tensor's hash and sketch
    // (params after the update, grads, Adam moments), in the order of `names`.
    receipt::StepRecord rec;
    rec.loss = loss;
    rec.grad_norm = std::sqrt(norm2);
    rec.lr = kLr;
    rec.batch_hash = receipt::batch_hash(tokens);
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::vector<float>* family[4] = {&params[k], &grads[k], &adam_m[k], &adam_v[k]};
      for (int f = 0; f < 4; ++f) rec.hashes[f].push_back(receipt::tensor_hash(*family[f]));
      // A gradient is sketched with its parameter's draws (the salt of the parameter's name).
      const receipt::TensorSketcher sketcher(params[k].size(), receipt::sketch_salt(names[k].c_str()));
      for (int f = 0; f < 2; ++f) rec.sketches[f].push_back(sketcher(*family[f]));
    }
    writer.append_batch(tokens);
    writer.append_step(rec);
    std::printf("step %d loss %.6f grad_norm %.6f\n", step, rec.loss, rec.grad_norm);
  }
  // The final parameters as float32 datasets (/tensors/step_000008/...), then complete = 1.
  writer.dump_tensor(kSteps, names[0], {V, V}, params[0]);
  writer.dump_tensor(kSteps, names[1], {V}, params[1]);
  writer.finish();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cpp_receipt: %s\n", e.what());
  return 2;
}
