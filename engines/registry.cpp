#include "registry.h"

#include <stdexcept>

#include "cpu_ref_engine.h"

namespace harness {

std::vector<std::string> engine_names() { return {"cpu-ref"}; }

std::unique_ptr<Engine> make_engine(std::string_view name) {
  if (name == "cpu-ref") return std::make_unique<CpuRefEngine>();
  std::string known;
  for (const auto& n : engine_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("--engine: unknown engine '" + std::string(name) + "' (available: " + known + ")");
}

}  // namespace harness
