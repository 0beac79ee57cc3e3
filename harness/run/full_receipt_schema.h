// The receipt description this harness writes and reads: the receipt library's core and
// what each of its engines adds (engines/registry.h). Everything of the harness that
// validates a receipt validates it against this one.
#pragma once

#include "receipt/receipt_schema.h"

namespace harness::run {

const receipt::ReceiptSchema& full_receipt_schema();

}  // namespace harness::run
