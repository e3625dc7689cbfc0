#pragma once
// The numerics of a training step, written once for every backend: the
// scalar rules (the loss scaler and the step's decision, delayed scaling's
// factor and amax history, the loss gradient's factor) and the per-element
// rules (unscaling, SGD, Adam and AdamW, the exact sum rounded to odd,
// swallowed updates, the statistics' exponent binning). The layers' math is
// numerics_layers.hpp. The CPU backend calls them on the host, the CUDA
// kernels on the device (MPSIM_HOST_DEVICE; nvcc's --expt-relaxed-constexpr
// for the constexpr ones), so the ordinary CPU tests prove the GPU's
// arithmetic. Nothing here names CUDA.
//
// Every binary32 operation is written as one operator, rounded once to
// nearest even and never fused: the host build targets x86-64 without FMA,
// and gpu/CMakeLists.txt compiles kernels with -fmad=false -prec-div=true
// -prec-sqrt=true -ftz=false, so both sides compute the same bits.

#include <bit>
#include <cmath>
#include <cstdint>

#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/round_to_odd.hpp"

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

// The decision at the end of a step, from the step's sums: whether it found
// inf or NaN (skip the optimiser step), and the unscaling factor of the scale
// the step ran with (GradScaler.unscale_ multiplies by 1/scale rounded once
// to binary32). Advances the scaler for the next step. Every backend ends a
// step with this; the CPU on the host, the CUDA backend in a one-thread kernel.
struct StepDecision {
  bool found_inf;
  bool unscale;         // the step's scale was not 1
  float inverse_scale;  // binary32 1/scale
};
constexpr StepDecision decide_step(LossScaleState& s, const LossScaling& config, double loss_sum,
                                   double grad_sum_squares) {
  const double scale = s.scale;
  const bool found_inf = !is_finite(grad_sum_squares) || !is_finite(loss_sum);
  update_loss_scale(s, config, found_inf);
  return {found_inf, scale != 1.0, static_cast<float>(1.0 / scale)};
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
  // > 0: PaLM's auxiliary z-loss, z_loss x log(Z)^2 per row, in the gradient
  // only (numerics_layers.hpp's softmax_cross_entropy_row).
  double z_loss = 0.0;
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

// Delayed scaling's amax history: a ring of `length` binary32 amaxes followed
// by the position of the next write (stored as a binary32 integer, exact below
// 2^24), so that the whole history is one tensor of length + 1 values that a
// backend keeps wherever its tensors live.
// The largest amax in the ring (0 for a fresh, zeroed ring).
MPSIM_HOST_DEVICE constexpr float history_amax(const float* ring, int length) {
  float largest = 0.0f;
  for (int i = 0; i < length; ++i) largest = largest < ring[i] ? ring[i] : largest;  // std::max's order
  return largest;
}
// Records this use's amax and advances the position.
MPSIM_HOST_DEVICE constexpr void push_history(float* ring, int length, float amax) {
  const int next = static_cast<int>(ring[length]);
  ring[next] = amax;
  ring[length] = static_cast<float>((next + 1) % length);
}

// --- Per-element rules ---------------------------------------------------------------------------------------------

// GradScaler.unscale_: one binary32 multiplication by the inverse of the
// step's scale (itself rounded once from binary64).
MPSIM_HOST_DEVICE inline float unscale(float g, float inverse_scale) { return g * inverse_scale; }

// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_, after
// unscaling): the factor min(1, max_norm / (norm + 1e-6)) that multiplies
// every unscaled gradient, norm = sqrt(sum of squares of the loss-scaled
// gradients) / scale, all in binary64 and rounded once to binary32 (PyTorch
// computes it in binary32: the factors differ in their last bits). 1 when
// max_norm is not positive (no clipping) or the norm is within it.
MPSIM_HOST_DEVICE inline float clip_factor(double scaled_sum_squares, double loss_scale, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  const double factor = static_cast<double>(max_norm) / (sqrt(scaled_sum_squares) / loss_scale + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

// SGD as PyTorch's torch.optim.SGD: g' = g + wd*w; m = momentum*m + g' (m = g'
// at the first step); the update added to the weight is -lr*m (-lr*g'
// without momentum).
struct SgdConstants {
  float neg_lr;  // -lr: the negation is exact
  float momentum, weight_decay;
  bool first_step;
};
MPSIM_HOST_DEVICE inline float sgd_update(const SgdConstants& c, float w, float g, float& m) {
  const float gi = c.weight_decay != 0.0f ? g + c.weight_decay * w : g;
  if (c.momentum == 0.0f) return c.neg_lr * gi;
  m = c.first_step ? gi : c.momentum * m + gi;
  return c.neg_lr * m;
}

// Adam and AdamW as PyTorch's torch.optim.Adam/AdamW at step t (1-based):
// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; the update is
// decay - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), where
// AdamW's decay is -lr*wd*w and Adam adds wd*w to g instead.
struct AdamConstants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float neg_lr_weight_decay;  // -lr * weight_decay (AdamW's decoupled decay)
  float step_size;            // lr / (1 - beta1^t)
  float bias2_sqrt;           // sqrt(1 - beta2^t)
  bool decoupled;
};
// Adam's bias corrections at step t, in binary64 (pow, sqrt) rounded once to
// binary32: the host computes them, for any backend.
struct AdamBias {
  float bias1, bias2_sqrt;  // 1 - beta1^t, sqrt(1 - beta2^t)
};
inline AdamBias adam_bias(float beta1, float beta2, std::int64_t step) {
  const double t = static_cast<double>(step);
  return {static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t)),
          static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(beta2), t)))};
}
// The constants of step t; step_size and bias2_sqrt from adam_bias.
inline AdamConstants adam_constants(float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                    std::int64_t step) {
  const AdamBias bias = adam_bias(beta1, beta2, step);
  return {beta1, beta2, 1.0f - beta1, 1.0f - beta2, eps, weight_decay, -lr * weight_decay, lr / bias.bias1,
          bias.bias2_sqrt, decoupled};
}
MPSIM_HOST_DEVICE inline float adam_update(const AdamConstants& c, float w, float g, float& m, float& v) {
  float decay = 0.0f;
  if (c.weight_decay != 0.0f) {
    if (c.decoupled) decay = c.neg_lr_weight_decay * w;
    else g = g + c.weight_decay * w;
  }
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) / c.bias2_sqrt + c.eps;
  return decay - c.step_size * m / denom;
}

// x + y rounded to binary64 by round-to-odd (emulation/round_to_odd.hpp): the
// weight update w + u and the GEMM's acc + a*b round this way, then once more
// to their format, with no double rounding.
using mpsim::add_round_to_odd;

// A nonzero update that leaves the weight unchanged was swallowed: the
// weight's spacing is more than twice the update (Micikevicius et al. 2018,
// section 3.1, the reason for FP32 master weights).
MPSIM_HOST_DEVICE constexpr bool swallowed(float update, float before, float after) {
  return update != 0.0f && after == before;
}

// --- Statistics: per-element classification -------------------------------------------------------------------------
// TensorStats (stats.hpp) bins a binary32 value by its exponent field; the
// CPU's vectorised histogram and the CUDA histogram kernel classify each value
// with these, and both hand TensorStats::add_field_counts the same counts.
// Binades follow IEEE 754-2019 3.4: field e in 1..254 is the binade
// 2^(e - 127); field 0 holds zeros and subnormals, field 255 inf and NaN.

// |x|'s pattern: the sign cleared, NaN payloads kept.
MPSIM_HOST_DEVICE constexpr std::uint32_t magnitude_bits(float x) {
  return std::bit_cast<std::uint32_t>(x) & 0x7fffffffu;
}
MPSIM_HOST_DEVICE constexpr std::uint32_t exponent_field(std::uint32_t magnitude) { return magnitude >> 23; }
// 0 < magnitude < 2^23, one unsigned comparison (it vectorises).
MPSIM_HOST_DEVICE constexpr bool is_subnormal_magnitude(std::uint32_t magnitude) {
  return magnitude - 1u < 0x7fffffu;
}
MPSIM_HOST_DEVICE constexpr bool is_infinite_magnitude(std::uint32_t magnitude) { return magnitude == 0x7f800000u; }
MPSIM_HOST_DEVICE constexpr bool is_nan_magnitude(std::uint32_t magnitude) { return magnitude > 0x7f800000u; }
// The subnormal binade k of a subnormal magnitude: its value lies in
// [2^(k - 149), 2^(k - 148)), k = index of its top bit, 0..22. A binary search
// rather than a count-leading-zeros builtin, so one spelling serves the host
// and the device (subnormals are rare: speed does not matter here).
MPSIM_HOST_DEVICE constexpr int subnormal_binade(std::uint32_t magnitude) {
  int k = 0;
  if (magnitude >= (1u << 16)) magnitude >>= 16, k += 16;
  if (magnitude >= (1u << 8)) magnitude >>= 8, k += 8;
  if (magnitude >= (1u << 4)) magnitude >>= 4, k += 4;
  if (magnitude >= (1u << 2)) magnitude >>= 2, k += 2;
  if (magnitude >= (1u << 1)) k += 1;
  return k;
}
// The key whose maximum over a tensor is its amax (delayed scaling): the
// magnitude's pattern, ordered like the values for non-NaN binary32, with
// NaN mapped to 0 (ignored). Integer max vectorises and is exact.
MPSIM_HOST_DEVICE constexpr std::uint32_t amax_key(float x) {
  const std::uint32_t magnitude = magnitude_bits(x);
  return is_nan_magnitude(magnitude) ? 0u : magnitude;
}
// The same over finite values only (infinities and NaN map to 0): the
// largest logit a layer computed, where a mask writes -inf
// (Backend::max_abs_finite).
MPSIM_HOST_DEVICE constexpr std::uint32_t finite_amax_key(float x) {
  const std::uint32_t magnitude = magnitude_bits(x);
  return magnitude < 0x7f800000u ? magnitude : 0u;
}

}  // namespace mpsim::core
