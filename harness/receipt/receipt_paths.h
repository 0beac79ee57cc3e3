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

// A golden's aten traces (`golden refresh` of a Python canary): per step, rows of the flat
// datasets below, step s's from offset[s], length[s] of them.
inline constexpr const char* kAtenTrace = "/aten_trace";
inline constexpr const char* kAtenTraceOffset = "/aten_trace/offset";
inline constexpr const char* kAtenTraceLength = "/aten_trace/length";
inline constexpr const char* kAtenTraceOpIndex = "/aten_trace/op_index";
inline constexpr const char* kAtenTraceLayer = "/aten_trace/layer";
inline constexpr const char* kAtenTraceOp = "/aten_trace/op";
inline constexpr const char* kAtenTracePhase = "/aten_trace/phase";
inline constexpr const char* kAtenTraceTensor = "/aten_trace/tensor";
inline constexpr const char* kAtenTraceKind = "/aten_trace/kind";
inline constexpr const char* kAtenTraceSite = "/aten_trace/site";
inline constexpr const char* kAtenTraceHash = "/aten_trace/hash";
inline constexpr const char* kAtenTraceL2 = "/aten_trace/l2";
inline constexpr const char* kAtenTraceProjection = "/aten_trace/projection";

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
          {"aten_trace", kAtenTrace},
          {"aten_trace_offset", kAtenTraceOffset},
          {"aten_trace_length", kAtenTraceLength},
          {"aten_trace_op_index", kAtenTraceOpIndex},
          {"aten_trace_layer", kAtenTraceLayer},
          {"aten_trace_op", kAtenTraceOp},
          {"aten_trace_phase", kAtenTracePhase},
          {"aten_trace_tensor", kAtenTraceTensor},
          {"aten_trace_kind", kAtenTraceKind},
          {"aten_trace_site", kAtenTraceSite},
          {"aten_trace_hash", kAtenTraceHash},
          {"aten_trace_l2", kAtenTraceL2},
          {"aten_trace_projection", kAtenTraceProjection},
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
