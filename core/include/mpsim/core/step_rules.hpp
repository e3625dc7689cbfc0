#pragma once
// The scalar rules of a training step, written once: the loss scaler's
// update and delayed scaling's factor. They are constexpr functions of plain
// values so that every backend runs this same code, the CPU backend on the
// host and the CUDA backend in a one-thread kernel (nvcc's
// --expt-relaxed-constexpr lets device code call constexpr functions). Nothing
// here names CUDA, and only <bit> and <cstdint> are included.

#include <bit>
#include <cstdint>

namespace mpsim::core {

// Per-tensor scaling before rounding to a narrow format (FP8), as Transformer
// Engine's delayed scaling: the scale comes from the largest |x| seen over the
// last `history` uses of the same tensor. mpsim uses powers of two, so scaling
// and unscaling are exact and only the rounding to the format is inexact.
struct DelayedScaling {
  int history = 16;
  int margin = 0;  // extra headroom: the scale is divided by 2^margin
};

enum class LossScaleMode : std::uint8_t { none, fixed, dynamic };

// PyTorch GradScaler semantics by default; hysteresis, min and max as in
// Megatron-LM's DynamicGradScaler (hysteresis = 1 is GradScaler).
struct LossScaling {
  LossScaleMode mode = LossScaleMode::none;
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;
  int hysteresis = 1;
  double min_scale = 0.0;  // 0: no minimum
  double max_scale = 0.0;  // 0: no maximum
  friend bool operator==(const LossScaling&, const LossScaling&) = default;
};

// A loss scaler between steps: GradScaler's scale and growth tracker, and
// Megatron's hysteresis tracker.
struct LossScaleState {
  double scale = 1.0;
  int growth_tracker = 0;
  int hysteresis_tracker = 1;
};

// False for inf and NaN (x - x is NaN for both), without <cmath>, which is
// not constexpr in C++20.
constexpr bool is_finite(double x) { return x - x == 0.0; }

constexpr LossScaleState initial_loss_scale(const LossScaling& config) {
  return {config.mode == LossScaleMode::none ? 1.0 : config.initial_scale, 0, config.hysteresis};
}

// Called once per step after the gradients are known; adjusts the scale for
// the next step. Returns true when the optimiser step must be skipped: some
// gradient or the loss is inf or NaN. Without a scaler nothing can be skipped
// with; the trainer then ends the arm (and the step's update does not run).
constexpr bool update_loss_scale(LossScaleState& s, const LossScaling& config, bool found_inf) {
  if (config.mode != LossScaleMode::dynamic) return found_inf;
  if (found_inf) {
    s.growth_tracker = 0;
    if (--s.hysteresis_tracker <= 0) {
      s.scale *= config.backoff_factor;
      if (config.min_scale > 0.0 && s.scale < config.min_scale) s.scale = config.min_scale;
    }
    return true;
  }
  if (++s.growth_tracker == config.growth_interval) {
    s.growth_tracker = 0;
    s.hysteresis_tracker = config.hysteresis;
    const double grown = s.scale * config.growth_factor;
    if (is_finite(grown)) s.scale = grown;  // GradScaler keeps the scale when growth overflows
    if (config.max_scale > 0.0 && s.scale > config.max_scale) s.scale = config.max_scale;
  }
  return false;
}

// What the backward pass differentiates: the batch's softmax cross-entropy,
// averaged over the batch (PyTorch's reduction="mean") or summed, times
// `weight`, as a loss term's coefficient in a weighted sum of losses. The
// logged loss is always the plain batch mean, so arms stay comparable. With
// SGD, a weight of 2^-k and a learning rate 2^k times larger give the same
// binary32 trajectory as weight 1 (powers of two scale exactly), while every
// gradient sits k binades lower: how far below FP16's window gradients are is
// a property of the loss's definition, not of the problem (Micikevicius et
// al., "Mixed Precision Training", ICLR 2018, section 3.2).
enum class LossReduction : std::uint8_t { mean, sum };
struct LossDefinition {
  LossReduction reduction = LossReduction::mean;
  double weight = 1.0;
  friend bool operator==(const LossDefinition&, const LossDefinition&) = default;
};

// The factor of the loss gradient d_logits = (softmax - onehot) * factor over
// `rows` rows, in binary32 as every backend computes it: (scale * weight)
// rounded once, then divided by rows for a mean.
constexpr float loss_gradient_factor(double loss_scale, const LossDefinition& loss, std::int64_t rows) {
  const auto scaled = static_cast<float>(loss_scale * loss.weight);
  return loss.reduction == LossReduction::mean ? scaled / static_cast<float>(rows) : scaled;
}

// Delayed scaling's factor for a point whose format's largest finite value is
// `largest`, given the largest amax of its history: the power of two 2^e with
// e = floor(log2(largest / amax)) - margin, clamped to binary32's normal
// exponents; 1 when amax is 0, inf or NaN (no usable history).
constexpr float delayed_scale(float amax, double largest, int margin) {
  if (!(amax > 0.0f) || !is_finite(amax)) return 1.0f;
  // largest / amax is a normal binary64 (largest >= 1, amax < 2^128), so
  // floor(log2) is its unbiased exponent field.
  const double ratio = largest / static_cast<double>(amax);
  int e = static_cast<int>((std::bit_cast<std::uint64_t>(ratio) >> 52) & 0x7ff) - 1023 - margin;
  e = e < -126 ? -126 : (e > 127 ? 127 : e);
  return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23);
}

}  // namespace mpsim::core
