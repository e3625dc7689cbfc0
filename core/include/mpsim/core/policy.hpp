#pragma once
// A precision policy says where a training step rounds and to what.
// docs/policies.md lists every rounding point and what each preset puts there;
// the GPU backend reproduces exactly these points.

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/core/names.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim::core {

// One rounding point: the format a value is stored in and how it is rounded there.
struct RoundingPoint {
  Format format = formats::binary32;
  Rounding rounding{};
  bool delayed_scaling = false;  // scale per tensor (see DelayedScaling) before rounding

  // binary32 with round-to-nearest and no scaling changes no binary32 value.
  bool is_identity() const;
  // True when every value that has passed `earlier` passes this point
  // unchanged: the identity, or the same format with neither point scaled (a
  // value already in a format rounds to itself in every mode, stochastic too).
  bool keeps_values_of(const RoundingPoint& earlier) const;
  friend bool operator==(const RoundingPoint& a, const RoundingPoint& b) {
    return a.format == b.format && a.rounding.mode == b.rounding.mode &&
           a.rounding.random_bits == b.rounding.random_bits && a.delayed_scaling == b.delayed_scaling;
  }
};

// A GEMM operand quantized to a block-scaled format (OCP MX, NVFP4,
// DeepSeek-V3's tiles, per-tensor FP8) along the GEMM's k, inside the GEMM,
// after its per-tensor point (activations, weights, gradient_operands) has
// rounded it: each GEMM role (forward, data gradient, weight gradient) has
// its own, because k runs along a different dimension of the same tensor in
// each (Transformer Engine's rowwise and columnwise copies). docs/policies.md.
struct BlockPoint {
  std::string preset;                 // the block format's name ("mxfp8-e4m3"); empty: not block-scaled
  std::string scale_rule;             // "", or "floor", "ceil" (power-of-two E8M0 scales), "nvfp4-te"
  BlockFormat format;                 // the preset with scale_rule applied
  Rounding rounding{};                // of the elements: nearest-even or stochastic
  bool hadamard = false;              // random Hadamard transform along k first (hadamard.hpp)

  bool enabled() const { return !preset.empty(); }
  friend bool operator==(const BlockPoint& a, const BlockPoint& b) {
    return a.preset == b.preset && a.scale_rule == b.scale_rule && a.rounding.mode == b.rounding.mode &&
           a.rounding.random_bits == b.rounding.random_bits && a.hadamard == b.hadamard;
  }
};

// "none", or PRESET[/stochastic][/rht][/floor|/ceil|/nvfp4-te]: "nvfp4/stochastic/rht", "mxfp8-e4m3/ceil".
std::optional<BlockPoint> parse_block_point(std::string_view text, std::string* error);
std::string to_string(const BlockPoint& point);  // "none" when not enabled

// "binary16", "bfloat16/stochastic", "e4m3/nearest_even/scaled": format[/mode][/scaled].
std::optional<RoundingPoint> parse_rounding_point(std::string_view text, std::string* error);
std::string to_string(const RoundingPoint& point);

// The config's names of the loss scaling modes and of the loss reductions.
inline constexpr EnumNames<LossScaleMode, 3> loss_scale_mode_names{{"none", "static", "dynamic"}};
inline std::string_view to_string(LossScaleMode mode) { return loss_scale_mode_names(mode); }
inline constexpr EnumNames<LossReduction, 2> loss_reduction_names{{"mean", "sum"}};
inline std::string_view to_string(LossReduction reduction) { return loss_reduction_names(reduction); }

struct Policy {
  std::string name;
  // Forward GEMM operands and output.
  RoundingPoint weights;           // working copy of the weights, rounded from the master copy once per step
  RoundingPoint activations;       // activation operand of Linear/Conv GEMMs
  RoundingPoint accumulation;      // binary32: FP32 accumulation; else every GEMM addition rounds to this
  // How GEMMs sum, when not as `accumulation` says ("ieee"): an accumulation
  // model name (emulation/accumulation.hpp), e.g. "h100" for the H100 tensor
  // core's block-FMA with truncation, or "pairwise-fp32". Tensor-core models
  // take the operands' format as input, so both operands of every GEMM must
  // share one unscaled format (docs/policies.md).
  std::string gemm = "ieee";
  RoundingPoint gemm_output;       // GEMM (+bias) results
  RoundingPoint elementwise;       // outputs of activations, pooling and normalisation
  // The arithmetic inside attention's softmax and inside LayerNorm/RMSNorm's
  // statistics (forward and backward): binary32 (the default) keeps their
  // binary32 ops and binary64 sums; a narrower format rounds every
  // intermediate result (numerics_layers.hpp's InternalRounding). An op that
  // fp32_ops lists ("softmax", "layer_norm") ignores its point.
  RoundingPoint softmax_internals;
  RoundingPoint norm_statistics;
  // The loss's softmax cross-entropy (its max, exponentials, sum, log, the
  // gradient softmax - one-hot and its factor) in that format unless fp32_ops
  // lists "softmax_cross_entropy"; binary32 by default. The training step's
  // loss and gradient only: evaluation measures the loss in binary32.
  RoundingPoint loss_internals;
  // Backward.
  RoundingPoint gradient_operands;  // output gradient as a GEMM operand (FP8: e5m2, scaled)
  RoundingPoint activation_grads;   // every gradient with respect to an activation
  RoundingPoint weight_grads;       // gradients with respect to parameters
  // Optimiser.
  bool master_weights = true;      // false: the weights live only in `weight_storage`
  RoundingPoint weight_storage;    // format of the stored weights (binary32 when master weights are kept)
  RoundingPoint optimizer_state;   // momentum and Adam moments
  // Ops that always compute and output binary32 whatever the points say, as
  // autocast's FP32 op list: "layer_norm", "gelu", "softmax_cross_entropy".
  std::vector<std::string> fp32_ops;
  // Block-scaled GEMM operands per role (block_points below); none by default.
  BlockPoint fprop_activations, fprop_weights;    // forward: activations x weights^T, k = in_features
  BlockPoint dgrad_gradients, dgrad_weights;      // data gradient: output gradient x weights, k = out_features
  BlockPoint wgrad_gradients, wgrad_activations;  // weight gradient: output gradient^T x activations, k = batch
  // The last N layers with GEMMs ignore the block points (the NVFP4 recipe
  // keeps the final layers in higher precision, arXiv 2509.25149 §4.1).
  int high_precision_last = 0;
  // With a tensor-core `gemm` and E8M0/UE4M3 block scales (applied inside
  // block-scaled tensor cores): products summed in the tensor core's
  // accumulator before each promotion to binary32, a multiple of the block
  // length; 0: never. Binary32 (software) scales promote once per block
  // (DeepSeek-V3) and take 0 here. Block_gemm.hpp.
  int block_promotion_interval = 0;
  LossScaling loss_scaling;
  DelayedScaling delayed_scaling;

  bool runs_in_fp32(std::string_view op) const;
};

// Every rounding point with its config key, in the order a step meets them.
struct NamedPoint {
  std::string_view name;
  RoundingPoint Policy::*point;
  std::string_view doc;  // what rounds there (docs/configs.md)
};
inline constexpr std::array<NamedPoint, 13> rounding_points{{
    {"weights", &Policy::weights, "working copy of the weights, rounded from the master copy once per step"},
    {"activations", &Policy::activations, "activation operand of Linear/Conv GEMMs"},
    {"accumulation", &Policy::accumulation, "binary32: FP32 accumulation; else every GEMM addition rounds to this"},
    {"gemm_output", &Policy::gemm_output, "GEMM (+bias) results"},
    {"elementwise", &Policy::elementwise, "outputs of activations, pooling and normalisation"},
    {"softmax_internals", &Policy::softmax_internals,
     "attention softmax's max, exponentials, sum and quotients (binary32: binary64 sum; not scaled or stochastic)"},
    {"norm_statistics", &Policy::norm_statistics,
     "LayerNorm/RMSNorm's mean, variance, 1/sqrt and backward row means (binary32: binary64 sums)"},
    {"loss_internals", &Policy::loss_internals,
     "the training loss's softmax cross-entropy and its gradient (binary32 when fp32_ops lists softmax_cross_entropy)"},
    {"gradient_operands", &Policy::gradient_operands, "output gradient as a GEMM operand (FP8: e5m2, scaled)"},
    {"activation_grads", &Policy::activation_grads, "every gradient with respect to an activation"},
    {"weight_grads", &Policy::weight_grads, "gradients with respect to parameters"},
    {"weight_storage", &Policy::weight_storage, "format of the stored weights (binary32 when master weights are kept)"},
    {"optimizer_state", &Policy::optimizer_state, "momentum and Adam moments"},
}};

// The GEMM roles and their block-scaled operand points, with config keys.
enum class GemmRole : std::uint8_t { fprop, dgrad, wgrad };
inline constexpr EnumNames<GemmRole, 3> gemm_role_names{{"fprop", "dgrad", "wgrad"}};
struct NamedBlockPoint {
  std::string_view name;
  BlockPoint Policy::*point;
  GemmRole role;
  int operand;  // 0: the GEMM's left operand (a), 1: its right (b)
  std::string_view doc;
};
inline constexpr std::array<NamedBlockPoint, 6> block_points{{
    {"fprop_activations", &Policy::fprop_activations, GemmRole::fprop, 0,
     "forward GEMM's activations, blocks along in_features"},
    {"fprop_weights", &Policy::fprop_weights, GemmRole::fprop, 1, "forward GEMM's weights, blocks along in_features"},
    {"dgrad_gradients", &Policy::dgrad_gradients, GemmRole::dgrad, 0,
     "data-gradient GEMM's output gradient, blocks along out_features"},
    {"dgrad_weights", &Policy::dgrad_weights, GemmRole::dgrad, 1,
     "data-gradient GEMM's weights, blocks along out_features"},
    {"wgrad_gradients", &Policy::wgrad_gradients, GemmRole::wgrad, 0,
     "weight-gradient GEMM's output gradient, blocks along the batch (rows)"},
    {"wgrad_activations", &Policy::wgrad_activations, GemmRole::wgrad, 1,
     "weight-gradient GEMM's activations, blocks along the batch (rows)"},
}};
// The index into block_points of a role's operand.
constexpr std::size_t block_point_index(GemmRole role, int operand) {
  return static_cast<std::size_t>(role) * 2 + static_cast<std::size_t>(operand);
}
bool uses_block_formats(const Policy& p);

// The rounding an op's internal arithmetic applies (numerics_layers.hpp):
// disabled when `point` is the identity or when fp32_ops lists `op`.
// Throws std::invalid_argument when the point is scaled or stochastic (an
// op's internals have no tensor to scale and no stream of draws).
InternalRounding internal_rounding(const Policy& p, const RoundingPoint Policy::*point, std::string_view op);
// Throws std::invalid_argument naming the problem when a role's block points
// cannot form a block-scaled GEMM: one operand block-scaled and not the
// other, blocks of different lengths along k, the transform on one side, a
// rounding other than nearest-even or stochastic, a gemm model that does not
// sum block-scaled operands ("ieee": exact block sums accumulated in
// binary32; a tensor-core model: the scaled products in its accumulator for
// E8M0/UE4M3 scales, DeepSeek-V3's promotion for binary32 scales, FP8
// elements only), or a promotion interval that does not fit.
void check_block_points(const Policy& p);
// How a role's block-scaled GEMM sums under p.gemm: nothing for "ieee"
// (exact block sums, binary32 across blocks), else the tensor-core model
// whose partials are promoted to binary32 (block_gemm.hpp's BlockGemmModel).
std::optional<TensorCoreModel> block_promotion(const Policy& p, const BlockFormat& a);

// The model a GEMM with operands in formats a and b uses under p.gemm:
// nothing for "ieee". Throws std::invalid_argument, naming the problem, when
// the name is unknown or the model cannot take these operands.
std::optional<AccumulationModel> gemm_model(const Policy& p, const RoundingPoint& a, const RoundingPoint& b);

// The presets: fp32, fp16-mixed, bf16-mixed, fp16-naive, fp8 (= fp8-delayed),
// fp8-delayed, fp8-current, mxfp8, nvfp4, deepseek-fp8, tf32 (docs/policies.md).
std::optional<Policy> preset_policy(std::string_view name);
std::vector<std::string> preset_policy_names();
// A human-readable table of every point of a policy (logged with each arm).
std::string describe(const Policy& policy);

// The ops a policy's fp32_ops may name: layer_norm, softmax (attention's),
// attention_logits (q k^T, kept in binary32 instead of rounding at
// gemm_output), residual (the residual stream), the activations that the table
// marks (numerics_layers.hpp), softmax_cross_entropy. The config reads,
// checks and documents the key from this list.
inline constexpr auto fp32_op_names = [] {
  constexpr auto marked = static_cast<std::size_t>(
      std::count(Activations::fp32_op.begin(), Activations::fp32_op.end(), true));
  std::array<std::string_view, marked + 5> names{};
  std::size_t n = 0;
  names[n++] = "layer_norm";
  names[n++] = "softmax";           // attention's softmax (its output, the probabilities)
  names[n++] = "attention_logits";  // attention's q k^T / sqrt(d), before any soft cap and the softmax
  names[n++] = "residual";  // the residual stream: the sums of residual connections
  for (std::size_t i = 0; i < Activations::size; ++i)
    if (Activations::fp32_op[i]) names[n++] = Activations::names.names[i];
  names[n++] = "softmax_cross_entropy";
  return names;
}();

}  // namespace mpsim::core
