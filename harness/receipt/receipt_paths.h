// The core receipt's groups and datasets that code names: each path is spelled here once,
// and the description (receipt_schema.cpp), the writer, the reader, the validator, the
// verdict and replay use these names. The export carries them too (`harness schema`,
// constants.paths), so the Python package reads the same spelling.
// tests/unit/receipt_schema_test.cpp holds every path here described.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace harness::receipt::paths {

inline constexpr const char* kManifest = "/manifest";

inline constexpr const char* kSteps = "/steps";
inline constexpr const char* kLoss = "/steps/loss";
inline constexpr const char* kGradNorm = "/steps/grad_norm";
inline constexpr const char* kLr = "/steps/lr";
inline constexpr const char* kBatchHash = "/steps/batch_hash";

inline constexpr const char* kHashes = "/hashes";
inline constexpr const char* kTensorNames = "/hashes/names";
inline constexpr const char* kSketches = "/sketches";

inline constexpr const char* kTrace = "/trace";
inline constexpr const char* kTraceOpIndex = "/trace/op_index";
inline constexpr const char* kTraceLayer = "/trace/layer";
inline constexpr const char* kTraceOp = "/trace/op";
inline constexpr const char* kTracePhase = "/trace/phase";
inline constexpr const char* kTraceTensor = "/trace/tensor";
inline constexpr const char* kTraceKind = "/trace/kind";
inline constexpr const char* kTraceHash = "/trace/hash";
inline constexpr const char* kTraceL2 = "/trace/l2";
inline constexpr const char* kTraceProjection = "/trace/projection";

inline constexpr const char* kBatches = "/batches";
inline constexpr const char* kBatchTokens = "/batches/tokens";
inline constexpr const char* kTensors = "/tensors";

inline constexpr const char* kCheckpoints = "/checkpoints";
inline constexpr const char* kCheckpointStep = "/checkpoints/step";
inline constexpr const char* kCheckpointContentHash = "/checkpoints/content_hash";
inline constexpr const char* kCheckpointOffset = "/checkpoints/offset";
inline constexpr const char* kCheckpointLength = "/checkpoints/length";
inline constexpr const char* kCheckpointState = "/checkpoints/state";

inline constexpr const char* kCompile = "/compile";

inline constexpr const char* kEval = "/eval";
inline constexpr const char* kEvalStep = "/eval/step";
inline constexpr const char* kEvalLoss = "/eval/loss";
inline constexpr const char* kEvalLogits = "/eval/logits";
inline constexpr const char* kEvalTargets = "/eval/targets";
inline constexpr const char* kEvalCompiles = "/eval/compiles";

// A family's datasets: /hashes/params, /sketches/grads_l2, /sketches/params_projection.
inline std::string hashes(std::string_view family) { return std::string(kHashes) + "/" + std::string(family); }
inline std::string sketch_l2(std::string_view family) {
  return std::string(kSketches) + "/" + std::string(family) + "_l2";
}
inline std::string sketch_projection(std::string_view family) {
  return std::string(kSketches) + "/" + std::string(family) + "_projection";
}

// A /manifest attribute's path, as messages name it: "/manifest/lane".
inline std::string manifest_attribute(std::string_view name) {
  return std::string(kManifest) + "/" + std::string(name);
}

// The name of a path's last segment, as a group handle creates it: "/steps/loss" -> "loss".
inline std::string leaf(std::string_view path) { return std::string(path.substr(path.rfind('/') + 1)); }

// Every fixed path above, by the key the export gives it (constants.paths): what the
// description must hold, and what the Python package reads by name.
inline std::vector<std::pair<std::string_view, std::string_view>> named() {
  return {{"manifest", kManifest},
          {"steps", kSteps},
          {"loss", kLoss},
          {"grad_norm", kGradNorm},
          {"lr", kLr},
          {"batch_hash", kBatchHash},
          {"hashes", kHashes},
          {"tensor_names", kTensorNames},
          {"sketches", kSketches},
          {"trace", kTrace},
          {"trace_op_index", kTraceOpIndex},
          {"trace_layer", kTraceLayer},
          {"trace_op", kTraceOp},
          {"trace_phase", kTracePhase},
          {"trace_tensor", kTraceTensor},
          {"trace_kind", kTraceKind},
          {"trace_hash", kTraceHash},
          {"trace_l2", kTraceL2},
          {"trace_projection", kTraceProjection},
          {"batches", kBatches},
          {"batch_tokens", kBatchTokens},
          {"tensors", kTensors},
          {"checkpoints", kCheckpoints},
          {"checkpoint_step", kCheckpointStep},
          {"checkpoint_content_hash", kCheckpointContentHash},
          {"checkpoint_offset", kCheckpointOffset},
          {"checkpoint_length", kCheckpointLength},
          {"checkpoint_state", kCheckpointState},
          {"compile", kCompile},
          {"eval", kEval},
          {"eval_step", kEvalStep},
          {"eval_loss", kEvalLoss},
          {"eval_logits", kEvalLogits},
          {"eval_targets", kEvalTargets},
          {"eval_compiles", kEvalCompiles}};
}

}  // namespace harness::receipt::paths
