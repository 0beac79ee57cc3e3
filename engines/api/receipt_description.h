// What a receipt holds, as data: every group, dataset and attribute with its type, shape,
// whether it must be there, the schema minor that added it and who writes it. The receipt
// library describes the core (harness/receipt/receipt_schema.cpp); each engine describes
// what it adds (its manifest settings, its per-step state groups) beside its flags, so
// the validator, the export for Python (`harness schema`) and docs/receipt-schema.md
// read one description and never name an engine's content.
#pragma once

#include <string>
#include <vector>

namespace harness {

enum class ReceiptDtype { kFloat64, kFloat32, kUint64, kInt64, kInt32, kUint8, kString };

// What fixes the length of a dataset's dimension.
enum class ReceiptDim {
  kSteps,        // the recorded steps (/steps/loss's length)
  kTensors,      // the hashed tensors (/hashes/names's length)
  kSketchWidth,  // the count sketch's buckets
  kColumns,      // the length of the dataset the entry's `columns` names
  kAny,          // any length
};

enum class ReceiptValue { kString, kInteger, kFloat };

// What a verdict gates on a per-step counter an engine records (docs/budgets.md): none,
// uncached compiles after the canary's warm-up, host syncs at any step
// ([compile-stability]), or peak bytes against the golden's ([memory]).
enum class CounterGate { kNone, kCompilesAfterWarmup, kHostSyncs, kPeakBytes };

// A dataset that records discrete decisions a run made (moe's routing), per step and column
// (the deciding op): kHash, one hash of a column's decisions, equal when it decided alike;
// kCount, how many choices went to one bucket (an expert), so that the sum of two runs'
// differences over a column's counts, halved, is how many choices at least moved. bisect
// finds them by this role, never by name, and says where two runs first decided otherwise.
enum class DecisionRecord { kNone, kHash, kCount };

// What a manifest attribute tells the verdict besides its value: the run's reduction order
// (its value kSeededOrder or kRacyOrder, any other a fixed order) and the seed that
// replays a seeded one. The verdict finds them by role, never by an engine's name for them.
enum class AttributeRole { kNone, kReductionOrder, kReductionSeed };
inline constexpr const char* kSeededOrder = "seeded";
inline constexpr const char* kRacyOrder = "racy";

// Required: present in every receipt (a group), or wherever its group is (a dataset, an
// attribute); otherwise the writer adds it when it has it, and the validator checks it
// where it is.
enum class Presence { kOptional, kRequired };

// A group. Its path has no '*'; a group not described here is listed as unknown.
struct ReceiptGroup {
  std::string path;
  Presence presence = Presence::kOptional;
  int since_minor = 0;
  std::string writer, meaning;
};

// A dataset. A '*' segment of its path is any name the writer chooses (a counter, a
// tensor); a path without one wins over a pattern that also matches.
struct ReceiptDataset {
  std::string path;
  ReceiptDtype dtype = ReceiptDtype::kFloat64;
  std::vector<ReceiptDim> shape;  // empty with any_rank: any number of dimensions
  bool any_rank = false;
  std::string columns;  // the dataset whose length is kColumns, when the shape uses it
  Presence presence = Presence::kOptional;
  int since_minor = 0;
  std::string writer, meaning;
  CounterGate gate = CounterGate::kNone;
  DecisionRecord decision = DecisionRecord::kNone;
};

// An attribute: "GROUP/NAME" ("/manifest/lane").
struct ReceiptAttribute {
  std::string path;
  ReceiptValue kind = ReceiptValue::kString;
  Presence presence = Presence::kOptional;
  int since_minor = 0;
  std::string writer, meaning;
  AttributeRole role = AttributeRole::kNone;
};

struct ReceiptEntries {
  std::vector<ReceiptGroup> groups;
  std::vector<ReceiptDataset> datasets;
  std::vector<ReceiptAttribute> attributes;

  void append(const ReceiptEntries& more) {
    groups.insert(groups.end(), more.groups.begin(), more.groups.end());
    datasets.insert(datasets.end(), more.datasets.begin(), more.datasets.end());
    attributes.insert(attributes.end(), more.attributes.begin(), more.attributes.end());
  }
};

// /compile's counters as every compiling writer records them (tpu-mesh, canary_harness's
// XLA and JAX lanes and its audited Recorder), the two a verdict gates first.
inline std::vector<ReceiptDataset> compile_counters(const std::string& writer) {
  using D = ReceiptDim;
  const auto counter = [&](const char* path, const char* meaning, CounterGate gate) {
    return ReceiptDataset{path, ReceiptDtype::kFloat64, {D::kSteps}, false, "", Presence::kOptional, 0, writer, meaning, gate};
  };
  return {counter("/compile/UncachedCompile", "programs compiled (found in no cache) during step s",
                  CounterGate::kCompilesAfterWarmup),
          counter("/compile/HostSync", "reads of device values by the host during step s", CounterGate::kHostSyncs),
          counter("/compile/*", "one counter during step s", CounterGate::kNone)};
}

}  // namespace harness
