// Engines by their command-line name. The name is also the engine's folder in engines/.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"
#include "api/engine_settings.h"
#include "api/receipt_description.h"

namespace harness {

// Throws std::invalid_argument with one line naming the flag: an unknown engine (listing
// the available ones), or features and options the engine does not take.
std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings = {});
std::vector<std::string> engine_names();
// What the engines add to a receipt (their manifest settings and state groups), engine by
// engine; harness/receipt/receipt_schema.h describes the rest.
ReceiptEntries engine_receipt_entries();

// An engine's flag (engines/api/engine_settings.h), as the CLI offers it and the nightly
// matrix takes it.
struct DescribedFlag {
  std::string engine;
  EngineFlag flag;
};
// Every engine's flags, engine by engine (cpu-ref has none).
std::vector<DescribedFlag> engine_flags();
// The flag of that name, nullptr when no engine has one.
const DescribedFlag* find_engine_flag(std::string_view name);

}  // namespace harness
