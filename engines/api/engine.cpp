#include "engine.h"

namespace harness {

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "unknown";
}

}  // namespace harness
