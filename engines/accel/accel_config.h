// The accel engine's numerics configuration, parsed from --features and the accel flags.
// docs/engines/accel.md describes each setting; the canonical feature string names every
// setting that changes the numerics, so two runs with the same lane are the same regime.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "api/engine_settings.h"
#include "api/receipt_description.h"
#include "api/tensor_table.h"
#include "noise.h"
#include "numerics/fp8_scaling.h"

namespace harness::accel {

// The linear layers FP8 can cover (the Fp8Zone roles of the tensor table), one bit each.
// The LM head has no zone and stays in bf16 (as in Transformer Engine recipes: the output
// layer is not quantised).
enum Fp8ZoneBits : unsigned { kZoneQkv = 1, kZoneAttnProj = 2, kZoneMlpFc = 4, kZoneMlpProj = 8, kAllZones = 15 };

// How the GEMMs split K: in fixed chunks (kSplitKChunk, the default), or as a GEMM
// library's heuristic picks by the output's shape (row_split_k_chunk), which makes the
// association order, and so the bits of a row, depend on how many rows the batch has.
enum class SplitK : std::uint8_t { Fixed, Rows };

// One unit of reduced precision: a zone's linear layer in one block, e.g. mlp_fc@1 =
// (kZoneMlpFc, 1). The unit switches below name units; triage switches them
// (precision_switches()).
using ZoneUnit = std::pair<unsigned, int>;

struct AccelConfig {
  bool bf16 = false;
  unsigned fp8_zones = 0;
  std::set<ZoneUnit> fp8_off;   // --fp8-off: units of the zones kept in bf16 (what triage switches)
  std::set<ZoneUnit> bf16_off;  // --bf16-off: units computed in fp32, FP8 included (what triage switches next)
  // Deliberate faults, for triage's own tests and drills: --fp8-e5m2 casts a unit's forward
  // operands to E5M2, a coarser format; --fp8-saturate quantises a unit with a scale 2^10
  // too large (a stale amax), so that its operands clip. A unit switched off by
  // --fp8-off or --bf16-off takes neither: it is not in FP8.
  std::set<ZoneUnit> fp8_e5m2;
  std::set<ZoneUnit> fp8_saturate;
  numerics::Fp8ScalingConfig scaling;
  int accumulate_interval = 0;  // 0: fp32 accumulation; N: limited accumulator promoted every N products
  NoiseMode noise = NoiseMode::Seeded;
  std::optional<std::uint64_t> noise_seed;  // seeded mode: replay this seed
  SplitK split_k = SplitK::Fixed;

  bool fp8() const { return fp8_zones != 0; }
  // "bf16+fp8=qkv,mlp_fc+noise=off": features and non-default settings, in a fixed order.
  std::string canonical_features() const;
  // The budget features (docs/budgets.md): "noise" always (reductions in GPU-style parts,
  // another association order than cpu-ref's even with noise off), "bf16" with bf16
  // autocast, "fp8" with FP8 zones, "fp8-limited" with the limited accumulator.
  std::vector<std::string> budget_features() const;
};

// accel's flags (--noise, --noise-seed, the FP8 scaling settings), in the CLI's order.
std::vector<EngineFlag> accel_flags();
// What accel adds to a receipt: its settings in the manifest, /fp8 with FP8 zones.
ReceiptEntries accel_receipt_entries();
// Throws std::invalid_argument with one line naming the flag (--features, --noise, ...).
// Every option must be one of accel_flags() (make_engine checks that first).
AccelConfig parse_accel_config(const EngineSettings& settings);

// The bit of a weight's FP8 zone role (Fp8Zone::MlpFc -> kZoneMlpFc), 0 for none.
unsigned zone_bit(Fp8Zone zone);
std::string zone_name(unsigned zone);
// "qkv@0,mlp_fc@1": units in zone order, then block order (the flags' and lanes' spelling).
std::string units_text(const std::set<ZoneUnit>& units);

// The units triage can switch, narrowest format first: the FP8 units of --features' zones
// (flag fp8-off), then every zone's unit in bf16 (flag bf16-off), in `layers` blocks;
// units already switched off are left out.
std::vector<PrecisionSwitch> precision_switches(const AccelConfig& config, int layers);

}  // namespace harness::accel
