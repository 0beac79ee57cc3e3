// A seeded one-ulp perturbation of a canary's initial weights (`run --perturb-init SEED`;
// docs/budgets.md, "Perturbation calibration"): every element of every parameter moves
// one fp32 ulp, up or down. The change is below anything a model is entitled to notice,
// so how far N such runs spread step by step is the divergence that a bitwise-irrelevant
// change (another reduction order, another kernel) may show: the envelope `harness
// calibrate --perturb N` proposes budgets from, on machines where repeats are bitwise.
//
// Element i of parameter NAME moves up when bit 0 of philox_at(SEED, stream_id("perturb/"
// NAME), i)'s first word is 1, down when it is 0: a pure function of seed, name and index,
// bit for bit the same in the Python package (canary_harness/runs/perturb.py), no libm.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "philox.h"

namespace harness::numerics {

// x moved one ulp toward +inf (up) or -inf, on its bits: either zero goes to the smallest
// subnormal of the direction's sign, the largest finite value to infinity; NaN and
// infinities stay.
inline float one_ulp_step(float x, bool up) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return x;  // inf, NaN
  std::uint32_t moved;
  if (magnitude == 0) {
    moved = up ? 0x00000001u : 0x80000001u;
  } else {
    const bool away_from_zero = up == (sign == 0);
    moved = sign | (away_from_zero ? magnitude + 1 : magnitude - 1);
  }
  float out;
  std::memcpy(&out, &moved, sizeof out);
  return out;
}

// Every element of `values` (parameter `name`'s initial values) moved one ulp.
inline void perturb_one_ulp(std::span<float> values, std::uint64_t seed, const std::string& name) {
  const std::uint64_t stream = stream_id(("perturb/" + name).c_str());
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = one_ulp_step(values[i], (philox_at(seed, stream, i)[0] & 1u) != 0);
  }
}

}  // namespace harness::numerics
