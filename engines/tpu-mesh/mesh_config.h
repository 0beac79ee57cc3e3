// The tpu-mesh engine's configuration, parsed from its command-line flags: the mesh, the
// shard plan, the precision and the compile settings. docs/engines/tpu-mesh.md describes
// each; the lane name carries every setting that changes the compiled program.
#pragma once

#include <string>
#include <vector>

#include "api/engine_settings.h"
#include "api/receipt_description.h"

namespace harness::tpu {

// A 2-D mesh of simulated devices with named axes `data` and `model`. Device i sits at
// (i / model, i % model), as in a row-major jax.sharding.Mesh.
struct Mesh {
  int data = 1;
  int model = 1;

  int devices() const { return data * model; }
  int data_coord(int device) const { return device / model; }
  int model_coord(int device) const { return device % model; }
  std::string to_string() const;  // "2x2"
};

enum class ShardPlan { DataParallel, TensorParallel, Zero3, ExpertParallel };
enum class Precision { Fp32, Bf16 };
// step: forward, backward and optimizer in one program (micro-batches unrolled in it);
// microstep: one forward+backward program run once per micro-batch, the optimizer apart.
enum class CompileMode { Step, Microstep };
inline constexpr int kMaxGradAccum = 64;

std::string to_string(ShardPlan plan);       // "dp", "tp", "zero3", "ep"
std::string to_string(Precision precision);  // "fp32", "bf16"
std::string to_string(CompileMode mode);     // "step", "microstep"

struct MeshConfig {
  Mesh mesh;
  ShardPlan plan = ShardPlan::DataParallel;
  Precision precision = Precision::Fp32;
  CompileMode compile_mode = CompileMode::Step;
  int grad_accum = 1;               // micro-batches per step (the batch splits into this many)
  bool leak_scalars = false;        // bake the learning rate into the graph (the XLA trap, on purpose)
  std::string compile_cache_dir;    // "" = in-memory cache only

  // "tpu-mesh@2x2": the engine part of the lane name.
  std::string engine_label() const;
  // "tp+bf16+microstep+accum4+leak-scalars": the plan and every non-default setting that
  // changes the program.
  std::string canonical_features() const;
  // The settings that change compiled output, sorted, as they enter the graph fingerprint.
  // The cache directory and thread count are left out: they never change the program.
  std::string fingerprint_flags() const;
  // The budget feature (docs/budgets.md): "mesh-bf16" with bf16 precision, else
  // "mesh-fp32" (collectives and micro-batches sum in another order than cpu-ref).
  std::vector<std::string> budget_features() const;
};

// tpu-mesh's flags (--mesh, --shard-plan, ...), in the CLI's order.
std::vector<EngineFlag> mesh_flags();
// What tpu-mesh adds to a receipt: its settings in the manifest, /compile and /memory.
ReceiptEntries mesh_receipt_entries();
// Throws std::invalid_argument with one line naming the flag (--mesh, --shard-plan, ...).
// Every option must be one of mesh_flags() (make_engine checks that first).
MeshConfig parse_mesh_config(const EngineSettings& settings);
Mesh parse_mesh(const std::string& text);

}  // namespace harness::tpu
