// An architecture as the rest of the harness knows it: its name (a canary file's
// `architecture`), the rules its canary files' model keys follow, how its canary identity
// is written, and its model. Each architecture describes itself in its own folder
// (architectures/NAME/); canary.cpp lists them, and the canary-file reader, the identity
// JSON and make_canary() read the descriptions, never an architecture's name.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "api/receipt_description.h"
#include "canary.h"

namespace harness::canary {

// What the model keys every architecture shares may say (docs/canary-files.md).
struct ModelKeyRules {
  bool grouped_query_attention = false;  // model.kv_heads may be fewer than model.heads
  bool rope = false;                     // model.rope_theta applies; a head's channels pair up (even head size)
  int mlp_ratio = 0;                     // model.mlp_hidden is this times model.channels; 0: the file gives it
};

// A [model] key of its own that an architecture declares (docs/canary-files.md): read
// after the shared keys, in declaration order, into its CanaryConfig field; carried by the
// identity JSON under the same name; refused in the canary file of an architecture that
// does not declare it ("llama has no experts: leave it out").
struct ModelKey {
  std::string_view name;                     // under [model], and in the identity JSON
  std::string_view feature;                  // what an architecture without it lacks: "experts"
  int CanaryConfig::*integer = nullptr;      // an integer key's field, in [low, high] ...
  double CanaryConfig::*number = nullptr;    // ... or a number key's ...
  // ... or a choice key's: one of `choices`, the first its default. The identity JSON
  // carries it only when it is not the default, so identities from before it existed stay.
  std::string CanaryConfig::*choice = nullptr;
  std::span<const std::string_view> choices = {};
  double low = 0.0, high = 0.0;
  bool open_low = false;                     // (low, high]
  int CanaryConfig::*high_field = nullptr;   // the range ends at this field, read before it (1..experts)
  bool required = false;                     // else the field keeps CanaryConfig's default
};

struct ArchitectureSpec {
  std::string_view name;
  ModelKeyRules rules;
  // Its canary identity (CanaryConfig::to_json) names no architecture and none of the
  // keys its rules fix: the identity receipts had before architectures were chosen, which
  // an identity without `architecture` therefore means. One architecture has it.
  bool legacy_identity = false;
  std::unique_ptr<Canary> (*make)(const CanaryConfig&, std::optional<FaultSpec>, bool trace_ops) = nullptr;
  // What its model adds to a receipt (Canary::step_state()); nullptr when nothing.
  ReceiptEntries (*receipt_entries)() = nullptr;
  // Its own [model] keys, beside the shared ones.
  std::span<const ModelKey> model_keys = {};
};

// Every architecture this build has a model for, in the order they are listed.
std::span<const ArchitectureSpec* const> architectures();
// The architecture of that name; nullptr when this build has none.
const ArchitectureSpec* find_architecture(std::string_view name);
// The one whose identity names no architecture.
const ArchitectureSpec& legacy_identity_architecture();
// What every architecture adds to a receipt, merged.
ReceiptEntries architecture_receipt_entries();

// Each folder's description (architectures/NAME/NAME.cpp).
const ArchitectureSpec& gpt2_architecture();
const ArchitectureSpec& llama_architecture();
const ArchitectureSpec& moe_architecture();

}  // namespace harness::canary
