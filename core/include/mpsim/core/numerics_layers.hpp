#pragma once
// The layers' arithmetic, written once for every backend: per element
// (activations, LayerNorm's normalisation and gradients) and per row
// (LayerNorm's statistics, softmax cross-entropy). The CPU backend loops over
// these on the host, the CUDA kernels call them on the device
// (MPSIM_HOST_DEVICE), so the CPU tests prove the GPU's arithmetic. Nothing
// here names CUDA.
//
// Bits: every binary32 and binary64 operation is one operator, rounded once
// to nearest even (numerics.hpp: no FMA contraction on either side). What
// still differs between the backends is the libm: erff, expf and logf are
// glibc's on the host and CUDA's on the device (CUDA documents at most 2, 2
// and 1 ulps), so GELU, SiLU, the gated units and the loss agree within the
// bounds tests/gpu/test_backend_ops.cpp states; everything else is bit for
// bit.
// The reductions that are not per row (the parameter gradients' sums over
// rows, Eigen's column sums) stay in each backend; LayerNorm's dgamma and
// dbeta add rows in increasing order from 0 on both.

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mpsim/core/names.hpp"
#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/pattern_rounding.hpp"
#include "mpsim/emulation/random_draw.hpp"
#include "mpsim/emulation/round_to_odd.hpp"

namespace mpsim::core {

// --- An op's internal arithmetic in a narrow format ----------------------------------------------------------------
// The policy's softmax_internals and norm_statistics points: when enabled,
// every intermediate result of the op's reductions (each input as read, each
// difference, product, exponential, running sum, quotient and square root)
// is the format's correctly rounded result, as a kernel computing in that
// format gets it; the sums run in increasing index. How, for any format of
// p <= 24 bits and any deterministic mode: operands are format values held
// in binary64; a sum is rounded to odd in binary64 and then into the format
// (correct: Boldo and Melquiond, IEEE TC 57(4), 2008); a product of two is
// exact in binary64; a quotient or square root that is not exact lies at
// least 2^-(2p+2) (relative) from every p-bit number and midpoint, farther
// than binary64's rounding error 2^-53, so rounding its binary64 value gives
// the correctly rounded result in every mode. Exponentials are binary64's
// exp rounded (libm's, not correctly rounded). Disabled (the default), the
// ops keep their binary32/binary64 arithmetic bit for bit.
struct InternalRounding {
  bool enabled = false;
  PatternFormat<std::uint64_t> format{};
  PatternRounding rounding{};  // a deterministic mode: no stream of draws inside an op

  // x rounded once into the format.
  MPSIM_HOST_DEVICE double operator()(double x) const {
    return std::bit_cast<double>(round_pattern<std::uint64_t>(std::bit_cast<std::uint64_t>(x), format, rounding, 0u).value);
  }
  // The format's a + b, a - b, a * b, a / b and sqrt(a), for a and b format values.
  MPSIM_HOST_DEVICE double add(double a, double b) const {
    const double sum = add_round_to_odd(a, b);
    // IEEE 754-2019 §6.3: an exact zero sum is -0 under roundTowardNegative unless both operands are +0
    // (binary64's nearest-even sum gave +0, or -0 for two -0s, which holds in the other modes).
    if (sum == 0.0 && rounding.mode == pattern_mode::toward_negative)
      return std::bit_cast<std::uint64_t>(a) == 0 && std::bit_cast<std::uint64_t>(b) == 0 ? 0.0 : -0.0;
    return (*this)(sum);
  }
  MPSIM_HOST_DEVICE double sub(double a, double b) const { return add(a, -b); }
  MPSIM_HOST_DEVICE double mul(double a, double b) const { return (*this)(a * b); }
  MPSIM_HOST_DEVICE double div(double a, double b) const { return (*this)(a / b); }
  MPSIM_HOST_DEVICE double root(double a) const { return (*this)(sqrt(a)); }
};

// --- Dropout (Srivastava et al., JMLR 2014) with a counter-based mask ------------------------------------------------
// Element i keeps its value when its 32-bit draw random_draw(key,
// first_index + i) is at least threshold = floor(p 2^32), so it keeps with
// probability 1 - p to within 2^-32, and is then scaled by 1 / (1 - p) in
// binary32 (inverted dropout, as PyTorch's); the rest are multiplied by 0, as
// PyTorch's x * mask * scale: a dropped NaN or infinity stays NaN (so an
// overflowed gradient is still found) and a dropped negative value gives -0. The backward
// applies the same mask to dy: the draws are recomputed from the counter, so
// no mask is stored and both backends draw the same one (random_draw.hpp).
struct DropoutMask {
  DrawKey key{};
  std::uint64_t first_index = 0;
  std::uint32_t threshold = 0;
  float scale = 1.0f;
};
MPSIM_HOST_DEVICE inline float dropout_value(float x, const DropoutMask& m, std::int64_t i) {
  return x * (random_draw(m.key, m.first_index + static_cast<std::uint64_t>(i)) >= m.threshold ? m.scale : 0.0f);
}

// --- Activations ----------------------------------------------------------------------------------------------------
// An element-wise activation is one entry of the table below: a struct with
// its enumerator (`kind`), its config and log name, whether a policy's
// fp32_ops may exempt it from rounding (autocast's FP32 list), and
// forward(x) = y and backward(x, dy) = dx, both host/device. The backends'
// generic activation op (a CPU loop, one templated CUDA kernel), the generic
// activation layer, the config's choices and the policies' fp32_ops all read
// the table, so adding an activation is this file alone: an enumerator, a
// struct, and its place in `Activations`.
enum class Activation : std::uint8_t { relu, gelu, silu };

// ReLU: NaN stays NaN (x <= 0 is false for NaN), as in PyTorch; the gradient
// at 0 is 0.
struct Relu {
  static constexpr Activation kind = Activation::relu;
  static constexpr std::string_view name = "relu";
  static constexpr bool fp32_op = false;
  static constexpr bool selects_gradient = true;  // backward gives dy or 0: no value that dy lacks
  MPSIM_HOST_DEVICE static float forward(float x) { return x <= 0.0f ? 0.0f : x; }
  MPSIM_HOST_DEVICE static float backward(float x, float dy) { return x > 0.0f ? dy : 0.0f; }
};

// GELU, the exact form x * Phi(x) (Hendrycks and Gimpel, "Gaussian Error
// Linear Units", 2016; PyTorch's approximate="none"):
// y = 0.5 x (1 + erf(x / sqrt 2)), dy/dx = Phi(x) + x phi(x).
struct Gelu {
  static constexpr Activation kind = Activation::gelu;
  static constexpr std::string_view name = "gelu";
  static constexpr bool fp32_op = true;  // autocast runs GELU in FP32 when fp32_ops lists it
  static constexpr bool selects_gradient = false;
  // binary32 1/sqrt(2) and 1/sqrt(2 pi), correctly rounded (as
  // static_cast<float>(M_SQRT1_2) and 0.3989422804014327f).
  static constexpr float sqrt1_2 = 0x1.6a09e6p-1f;
  static constexpr float inv_sqrt_2pi = 0x1.988454p-2f;
  MPSIM_HOST_DEVICE static float forward(float x) { return 0.5f * x * (1.0f + erff(x * sqrt1_2)); }
  MPSIM_HOST_DEVICE static float backward(float x, float dy) {
    const float cdf = 0.5f * (1.0f + erff(x * sqrt1_2));
    const float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

// SiLU (swish), x * sigmoid(x) (Elfwing et al. 2018; Ramachandran et al.
// 2017): y = x s, dy/dx = s (1 + x (1 - s)), s = sigmoid(x) computed as
// 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, so that no
// exponential overflows (x / (1 + e^-x) gives -0 below x = -88.7, where
// x s is still a normal binary32). SwiGLU's gate (gated_forward below).
struct Silu {
  static constexpr Activation kind = Activation::silu;
  static constexpr std::string_view name = "silu";
  static constexpr bool fp32_op = false;
  static constexpr bool selects_gradient = false;
  MPSIM_HOST_DEVICE static float sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
  }
  MPSIM_HOST_DEVICE static float forward(float x) { return x * sigmoid(x); }
  MPSIM_HOST_DEVICE static float backward(float x, float dy) {
    const float s = sigmoid(x);
    return dy * (s * (1.0f + x * (1.0f - s)));
  }
};

// The table: every activation, in the enum's order.
template <typename... A>
struct ActivationTable {
  static constexpr std::size_t size = sizeof...(A);
  static constexpr EnumNames<Activation, size> names{{A::name...}};
  static constexpr std::array<bool, size> fp32_op{A::fp32_op...};
  // Calls f(A{}) with the entry of `kind` (host code: a backend picks its loop or kernel).
  template <typename F>
  static void visit(Activation kind, F&& f) {
    (void)((A::kind == kind ? (f(A{}), true) : false) || ...);
  }
  static constexpr bool in_enum_order() {
    std::size_t i = 0;
    return ((static_cast<std::size_t>(A::kind) == i++) && ...);
  }
};
using Activations = ActivationTable<Relu, Gelu, Silu>;
static_assert(Activations::in_enum_order(), "Activations lists every activation in the enum's order");

// The names: the config's model.activation, the log, messages.
inline constexpr const auto& activation_names = Activations::names;
inline std::string_view to_string(Activation kind) { return activation_names(kind); }
// Whether a policy's fp32_ops may name this activation.
constexpr bool activation_is_fp32_op(Activation kind) { return Activations::fp32_op[static_cast<std::size_t>(kind)]; }

// --- Gated linear units (Shazeer, "GLU Variants Improve Transformer", 2020) -------------------------------------
// A row of 2n values [a | b] gives n values f(a_j) * b_j, f an activation of
// the table (SiLU: SwiGLU, as LLaMA's MLP; GELU: GEGLU). Backward:
// da = f'(a) (dy b) (the table's backward with dy b), db = dy f(a).
template <typename A>
MPSIM_HOST_DEVICE inline float gated_forward(float a, float b) {
  return A::forward(a) * b;
}
template <typename A>
MPSIM_HOST_DEVICE inline float gated_gate_grad(float a, float b, float dy) {
  return A::backward(a, dy * b);
}
template <typename A>
MPSIM_HOST_DEVICE inline float gated_value_grad(float a, float dy) {
  return dy * A::forward(a);
}

// --- LayerNorm (Ba, Kiros and Hinton, "Layer Normalization", 2016) --------------------------------------------------
// y = (x - mean) * rstd * gamma + beta over each row of `cols` features.

// A row's statistics: mean and rstd = 1 / sqrt(var + eps) (biased variance,
// as PyTorch), summed in binary64 in increasing j (two passes: the mean, then
// the squared deviations) and stored as binary32.
struct LayerNormStatistics {
  float mean, rstd;
};
// Uncentred (RMSNorm below): the mean is taken as 0, rstd = 1 / sqrt(mean(x^2) + eps).
// With `low` enabled: s = sum x_j, mean = s / n, var = sum (x_j - mean)^2 / n,
// rstd = 1 / sqrt(var + eps), every step rounded by `low` (a binary16 sum of
// squares overflows once the row's RMS passes sqrt(65504 / n): rstd becomes 0).
MPSIM_HOST_DEVICE inline LayerNormStatistics layer_norm_statistics(const float* row, std::int64_t cols, float eps,
                                                                   bool centered = true,
                                                                   const InternalRounding& low = {}) {
  if (low.enabled) {
    const double count = low(static_cast<double>(cols));
    double s = 0.0, s2 = 0.0;
    if (centered)
      for (std::int64_t j = 0; j < cols; ++j) s = low.add(s, low(row[j]));
    const double m = centered ? low.div(s, count) : 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double d = low.sub(low(row[j]), m);
      s2 = low.add(s2, low.mul(d, d));
    }
    const double rstd = low.div(1.0, low.root(low.add(low.div(s2, count), low(eps))));
    return {static_cast<float>(m), static_cast<float>(rstd)};
  }
  const double count = static_cast<double>(cols);
  double s = 0.0, s2 = 0.0;
  if (centered)
    for (std::int64_t j = 0; j < cols; ++j) s += static_cast<double>(row[j]);
  const double m = centered ? s / count : 0.0;
  for (std::int64_t j = 0; j < cols; ++j) {
    const double d = static_cast<double>(row[j]) - m;
    s2 += d * d;
  }
  return {static_cast<float>(m), static_cast<float>(1.0 / sqrt(s2 / count + static_cast<double>(eps)))};
}
// The scale a norm multiplies by: gamma, or with a zero-centred gamma 1 +
// gamma in binary32 (Transformer Engine's zero_centered_gamma, Megatron-LM's
// apply_layernorm_1p; Gemma's RMSNorm): the parameter starts at 0, weight
// decay pulls the scale toward 1, and a narrow weight format keeps gamma's
// small offsets from 1, which it would round away at 1 (bfloat16's spacing
// there is 2^-7).
MPSIM_HOST_DEVICE inline float norm_scale(float gamma, bool zero_centered) {
  return zero_centered ? 1.0f + gamma : gamma;
}
MPSIM_HOST_DEVICE inline float layer_norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
MPSIM_HOST_DEVICE inline float layer_norm_output(float x, float mean, float rstd, float gamma, float beta) {
  return layer_norm_xhat(x, mean, rstd) * gamma + beta;
}

// Backward, per row: the means of dxhat = dy * gamma and of dxhat * xhat
// (binary64 sums in increasing j, stored as binary32; with `low` enabled,
// xhat, dxhat, each product, each running sum and each mean rounded by
// `low`), then per element dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
struct LayerNormRowMeans {
  float dxhat, dxhat_xhat;
};
// Uncentred, mean(dxhat) is 0 (no mean was subtracted): dx = rstd * (dxhat - xhat * mean(dxhat * xhat)).
MPSIM_HOST_DEVICE inline LayerNormRowMeans layer_norm_row_means(const float* row, const float* dy_row,
                                                                const float* gamma, std::int64_t cols, float mean,
                                                                float rstd, bool centered = true,
                                                                const InternalRounding& low = {},
                                                                bool zero_centered = false) {
  if (low.enabled) {
    const double count = low(static_cast<double>(cols));
    const double m = low(mean), r = low(rstd);
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double xhat = low.mul(low.sub(low(row[j]), m), r);
      const double dxhat = low.mul(low(dy_row[j]), low(norm_scale(gamma[j], zero_centered)));
      sum_dxhat = low.add(sum_dxhat, dxhat);
      sum_dxhat_xhat = low.add(sum_dxhat_xhat, low.mul(dxhat, xhat));
    }
    return {centered ? static_cast<float>(low.div(sum_dxhat, count)) : 0.0f,
            static_cast<float>(low.div(sum_dxhat_xhat, count))};
  }
  double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
  for (std::int64_t j = 0; j < cols; ++j) {
    const float xhat = layer_norm_xhat(row[j], mean, rstd);
    const float dxhat = dy_row[j] * norm_scale(gamma[j], zero_centered);
    sum_dxhat += static_cast<double>(dxhat);
    sum_dxhat_xhat += static_cast<double>(dxhat) * static_cast<double>(xhat);
  }
  const double count = static_cast<double>(cols);
  return {centered ? static_cast<float>(sum_dxhat / count) : 0.0f, static_cast<float>(sum_dxhat_xhat / count)};
}
MPSIM_HOST_DEVICE inline float layer_norm_input_grad(float dy, float gamma, float xhat, float rstd,
                                                     const LayerNormRowMeans& means) {
  return rstd * (dy * gamma - means.dxhat - xhat * means.dxhat_xhat);
}

// --- RMSNorm (Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019; LLaMA) ----------------------------
// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps): LayerNorm's rules
// uncentred (centered = false, mean 0), no beta. The backward is
// layer_norm_input_grad with the uncentred row means and mean 0;
// dgamma = sum over rows of dy * xhat.
MPSIM_HOST_DEVICE inline float rms_norm_output(float x, float rstd, float gamma) {
  return layer_norm_xhat(x, 0.0f, rstd) * gamma;
}

// --- Softmax cross-entropy, one row ----------------------------------------------------------------------------------
// loss = log(sum_j exp(z_j - max)) - (z_label - max), the max-shifted
// log-sum-exp; d[j] = (softmax_j - [j == label]) * factor; correct when the
// first largest logit is the label's. The label is a class index stored as
// binary32; anything outside [0, cols) gives a NaN loss and no one-hot term.
// z_loss = c > 0 adds c log(Z)^2 to what the gradient differentiates
// (Chowdhery et al. 2022, PaLM, section 5: it keeps log Z, the log of the
// softmax's normaliser, near 0): log Z = max + log_sum in binary32, and
// d[j] = (softmax_j (1 + 2 c log Z) - [j == label]) * factor. The returned
// loss stays the cross-entropy alone; c = 0 changes no bit.
// With `low` enabled (policy.loss_internals), the same rule computed in that
// format: the logits as read, the max, each z_j - max and exponential, the
// running sum (in increasing j), log of the sum, each quotient e_j / sum,
// log Z and the z-loss factor, each difference with the one-hot term and the
// product with the factor (itself rounded once) are each rounded by `low`;
// the loss is log_sum - (z_label - max) in the format. Whether the prediction
// is correct is read from the binary32 logits either way: it measures the
// model, not the loss's arithmetic.
struct SoftmaxRow {
  float loss;
  bool correct;
};
MPSIM_HOST_DEVICE inline SoftmaxRow softmax_cross_entropy_row(const float* row, std::int64_t cols, float label_value,
                                                              float factor, float* d, float z_loss = 0.0f,
                                                              const InternalRounding& low = {}) {
  const bool valid = label_value >= 0.0f && label_value < static_cast<float>(cols);
  const std::int64_t label = valid ? static_cast<std::int64_t>(label_value) : -1;
  std::int64_t argmax = 0;
  float max = row[0];
  for (std::int64_t j = 1; j < cols; ++j)
    if (row[j] > max) max = row[j], argmax = j;
  const float nan = std::bit_cast<float>(0x7fc00000u);
  if (low.enabled) {
    double top = low(row[0]);
    for (std::int64_t j = 1; j < cols; ++j) top = fmax(top, low(row[j]));
    double sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double e = low(exp(low.sub(low(row[j]), top)));
      d[j] = static_cast<float>(e);
      sum = low.add(sum, e);
    }
    const double log_sum = low(log(sum));
    const double z_factor =
        z_loss != 0.0f ? low.add(1.0, low.mul(low(2.0 * z_loss), low.add(top, log_sum))) : 1.0;
    const double scaled_by = low(factor);
    for (std::int64_t j = 0; j < cols; ++j) {
      double g = low.div(d[j], sum);
      if (z_loss != 0.0f) g = low.mul(g, z_factor);
      d[j] = static_cast<float>(low.mul(low.sub(g, j == label ? 1.0 : 0.0), scaled_by));
    }
    return {valid ? static_cast<float>(low.sub(log_sum, low.sub(low(row[label]), top))) : nan,
            valid && argmax == label};
  }
  float sum = 0.0f;
  for (std::int64_t j = 0; j < cols; ++j) sum += expf(row[j] - max);
  const float log_sum = logf(sum);
  const float z_factor = z_loss != 0.0f ? 1.0f + 2.0f * z_loss * (max + log_sum) : 1.0f;
  for (std::int64_t j = 0; j < cols; ++j) {
    const float p = expf(row[j] - max - log_sum);
    d[j] = (z_loss != 0.0f ? p * z_factor - (j == label ? 1.0f : 0.0f) : p - (j == label ? 1.0f : 0.0f)) * factor;
  }
  return {valid ? log_sum - (row[label] - max) : nan, valid && argmax == label};
}

}  // namespace mpsim::core
