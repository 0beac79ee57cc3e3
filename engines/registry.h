// Engines by their command-line name. The name is also the engine's folder in engines/.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"

namespace harness {

// Throws std::invalid_argument naming the available engines when `name` is unknown.
std::unique_ptr<Engine> make_engine(std::string_view name);
std::vector<std::string> engine_names();

}  // namespace harness
