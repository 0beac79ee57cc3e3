#include "fp8_scaling.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "numerics/isa_dispatch.h"

namespace harness::numerics {

std::string_view to_string(Fp8Recipe recipe) { return recipe == Fp8Recipe::Delayed ? "delayed" : "current"; }
std::string_view to_string(AmaxAlgo algo) { return algo == AmaxAlgo::Max ? "max" : "most_recent"; }

namespace {
bool is_finite(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7F800000u) != 0x7F800000u; }
}  // namespace

float compute_fp8_scale(float amax, float previous_scale, float fp8_max, int margin) {
  if (!(amax > 0.0f) || !is_finite(amax)) return previous_scale;
  // (fp8_max / amax) / 2^margin: the division by a power of two is exact (short of underflow).
  float scale = fp8_max / amax;
  for (int i = 0; i < margin; ++i) scale *= 0.5f;
  if (!is_finite(scale)) return std::numeric_limits<float>::max();
  return scale;
}

float tensor_amax(const float* x, std::int64_t n) {
  // On magnitudes' bit patterns, integer order is value order and every NaN is above
  // infinity: one integer max finds the amax and any NaN, and it vectorises.
  // An integer max is the same in any grouping: at the widest width.
  std::uint32_t largest = 0;
  run_widest([&]() __attribute__((always_inline)) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t magnitude = std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu;
      largest = magnitude > largest ? magnitude : largest;
    }
  });
  return largest > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(largest);
}

Fp8ScalingState::Fp8ScalingState(Fp8Format format, const Fp8ScalingConfig& config)
    : format_(format), config_(config), history_(static_cast<std::size_t>(std::max(1, config.amax_history_len)), 0.0f) {}

float Fp8ScalingState::scale_for(float amax) {
  // Several uses in one step keep the largest amax; a NaN amax wins (it marks the step).
  step_amax_ = !seen_this_step_ || amax != amax || amax > step_amax_ ? amax : step_amax_;
  seen_this_step_ = true;
  history_[0] = step_amax_;
  if (config_.recipe == Fp8Recipe::Current) {
    // TE's current scaling has no history to fall back on: scale 1 for a zero or
    // non-finite amax.
    scale_ = compute_fp8_scale(amax, 1.0f, fp8_traits(format_).max_finite, config_.margin);
  }
  return scale_;
}

void Fp8ScalingState::end_step() {
  seen_this_step_ = false;
  step_amax_ = 0.0f;  // a role not used next step records amax 0, as its history slot does
  if (config_.recipe == Fp8Recipe::Current) return;
  float amax = history_[0];
  if (config_.amax_algo == AmaxAlgo::Max) {
    for (float h : history_) amax = (h != h || amax != amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, h);
  }
  std::rotate(history_.begin(), history_.begin() + 1, history_.end());  // torch.roll(h, -1)
  history_[0] = 0.0f;
  scale_ = compute_fp8_scale(amax, scale_, fp8_traits(format_).max_finite, config_.margin);
}

void Fp8ScalingState::restore(float scale, std::span<const float> history) {
  if (history.size() != history_.size()) {
    throw std::invalid_argument(fmt::format("fp8 scaling state: the history holds {} steps, this run's --amax-history {}",
                                            history.size(), history_.size()));
  }
  std::copy(history.begin(), history.end(), history_.begin());
  scale_ = scale;
  step_amax_ = 0.0f;
  seen_this_step_ = false;
}

}  // namespace harness::numerics
