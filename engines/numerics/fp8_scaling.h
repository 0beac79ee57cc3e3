// FP8 tensor scaling, as NVIDIA Transformer Engine does it.
//
// A tensor x is quantised as q = satfinite_rne(x * scale) and used as q * (1/scale), so
// the scale maps the tensor's range onto the format's. Each FP8 tensor role (a layer's
// forward input, its weight, its backward output-gradient) keeps its own state.
//
//  - delayed (TE's DelayedScaling, the default): the scale used at step s comes from the
//    amax history of earlier steps. The step's amax goes into history slot 0; at the end
//    of the step amax = max(history) ("max") or history[0] ("most_recent"),
//    scale = (fp8_max / amax) / 2^margin, the history rolls by one (torch.roll(h, -1))
//    and slot 0 is cleared for the next step.
//    A zero or non-finite amax keeps the previous scale. The first step uses scale 1.
//  - current: the scale comes from this tensor's own amax, right before quantising; a
//    zero or non-finite amax gives scale 1 (there is no earlier scale to keep).
// In both an infinite scale (amax tiny) becomes FLT_MAX.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "formats.h"

namespace harness::numerics {

enum class Fp8Recipe : std::uint8_t { Delayed, Current };
enum class AmaxAlgo : std::uint8_t { Max, MostRecent };
std::string_view to_string(Fp8Recipe recipe);
std::string_view to_string(AmaxAlgo algo);

struct Fp8ScalingConfig {
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int amax_history_len = 1024;
  AmaxAlgo amax_algo = AmaxAlgo::Max;
  int margin = 0;
};

// TE's _default_sf_compute.
float compute_fp8_scale(float amax, float previous_scale, float fp8_max, int margin);

// max |x| over the tensor (order-free, so deterministic under any split); NaN if any x is NaN.
float tensor_amax(const float* x, std::int64_t n);

class Fp8ScalingState {
 public:
  Fp8ScalingState(Fp8Format format, const Fp8ScalingConfig& config);

  // The scale to quantise a tensor of this role with, given the tensor's amax; records
  // the amax for this step (the largest, if the role is quantised more than once).
  float scale_for(float amax);
  // The step is over: delayed scaling computes the next scale and rolls the history.
  void end_step();

  // The scale the last scale_for() returned; under delayed scaling also the one this
  // step's scale_for() calls will return (set by end_step() or restore()).
  float scale() const { return scale_; }
  // Whether scale_for() returns scale() whatever the amax it is given: delayed scaling
  // quantises with the scale its history made, and this step's amax only joins the history.
  // A caller may then quantise and find the amax in one pass, and record it afterwards.
  bool scale_precedes_amax() const { return config_.recipe == Fp8Recipe::Delayed; }
  float step_amax() const { return step_amax_; }       // the amax recorded this step (0 after end_step)
  std::span<const float> history() const { return history_; }

  // Between steps the state is the scale and the history (checkpoints): restore() sets
  // both; throws std::invalid_argument when the history has another length.
  void restore(float scale, std::span<const float> history);

 private:
  Fp8Format format_;
  Fp8ScalingConfig config_;
  float scale_ = 1.0f;
  float step_amax_ = 0.0f;
  bool seen_this_step_ = false;
  std::vector<float> history_;
};

}  // namespace harness::numerics
