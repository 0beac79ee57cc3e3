#include "full_receipt_schema.h"

#include "architecture.h"
#include "registry.h"

namespace harness::run {

const receipt::ReceiptSchema& full_receipt_schema() {
  static const receipt::ReceiptSchema schema = [] {
    ReceiptEntries entries = receipt::core_receipt_entries();
    entries.append(engine_receipt_entries());
    entries.append(canary::architecture_receipt_entries());
    return receipt::ReceiptSchema(entries);
  }();
  return schema;
}

}  // namespace harness::run
