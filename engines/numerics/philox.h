// Philox4x32-10 counter-based random numbers (Salmon et al., SC'11; the generator behind
// cuRAND's and JAX's counter-based streams) and a deterministic normal sampler.
//
// Counter-based means element i of stream s under seed k is a pure function (k, s, i):
// any element can be generated independently, in any order, on any number of threads,
// and the result never depends on the standard library (std::normal_distribution's
// output differs between libstdc++ and libc++; this never does).
#pragma once

#include <array>
#include <cstdint>

#include "det_math.h"

namespace harness::numerics {

using PhiloxBlock = std::array<std::uint32_t, 4>;

constexpr PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * counter[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// The 4 random words at position `index` of stream `stream` under `seed`.
constexpr PhiloxBlock philox_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                        static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                       {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

// Uniform double in (0, 1] from 53 random bits (never 0, so log() is finite).
constexpr double uniform_open0(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t bits53 = ((static_cast<std::uint64_t>(hi) << 32) | lo) >> 11;
  return (static_cast<double>(bits53) + 1.0) * (1.0 / 9007199254740992.0);
}

// Standard normal sample number `index` of `stream` (Box-Muller, cosine branch).
inline double normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const PhiloxBlock w = philox_at(seed, stream, index);
  const double u1 = uniform_open0(w[0], w[1]);
  const double u2 = uniform_open0(w[2], w[3]);
  const double radius = -2.0 * det_log(u1);
  // sqrt is exactly rounded by IEEE-754 (one sqrtsd), so it is portable as it is.
  return __builtin_sqrt(radius) * det_cos(2.0 * kPi * u2);
}

// Stream id from a name (FNV-1a 64): a tensor's random stream depends on its name only,
// so adding a tensor to the model never shifts another tensor's initial values.
constexpr std::uint64_t stream_id(const char* name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (; *name; ++name) h = (h ^ static_cast<unsigned char>(*name)) * 0x100000001b3ull;
  return h;
}

}  // namespace harness::numerics
