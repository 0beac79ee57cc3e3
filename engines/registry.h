// Engines by their command-line name. The name is also the engine's folder in engines/.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"
#include "api/engine_settings.h"

namespace harness {

// Throws std::invalid_argument with one line naming the flag: an unknown engine (listing
// the available ones), or features and options the engine does not take.
std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings = {});
std::vector<std::string> engine_names();

}  // namespace harness
