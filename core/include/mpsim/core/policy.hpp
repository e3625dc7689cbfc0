#pragma once
// A precision policy says where a training step rounds and to what.
// docs/policies.md lists every rounding point and what each preset puts there;
// the GPU backend reproduces exactly these points.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/core/numerics.hpp"
#include "mpsim/emulation/accumulation.hpp"
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

// "binary16", "bfloat16/stochastic", "e4m3/nearest_even/scaled": format[/mode][/scaled].
std::optional<RoundingPoint> parse_rounding_point(std::string_view text, std::string* error);
std::string to_string(const RoundingPoint& point);

std::string_view to_string(LossScaleMode mode);  // "none", "static", "dynamic" (the config's names)

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
  LossScaling loss_scaling;
  DelayedScaling delayed_scaling;

  bool runs_in_fp32(std::string_view op) const;
};

// Every rounding point with its config key, in the order a step meets them.
struct NamedPoint {
  std::string_view name;
  RoundingPoint Policy::*point;
};
inline constexpr std::array<NamedPoint, 10> rounding_points{{
    {"weights", &Policy::weights},
    {"activations", &Policy::activations},
    {"accumulation", &Policy::accumulation},
    {"gemm_output", &Policy::gemm_output},
    {"elementwise", &Policy::elementwise},
    {"gradient_operands", &Policy::gradient_operands},
    {"activation_grads", &Policy::activation_grads},
    {"weight_grads", &Policy::weight_grads},
    {"weight_storage", &Policy::weight_storage},
    {"optimizer_state", &Policy::optimizer_state},
}};

// The model a GEMM with operands in formats a and b uses under p.gemm:
// nothing for "ieee". Throws std::invalid_argument, naming the problem, when
// the name is unknown or the model cannot take these operands.
std::optional<AccumulationModel> gemm_model(const Policy& p, const RoundingPoint& a, const RoundingPoint& b);

// The presets: fp32, fp16-mixed, bf16-mixed, fp16-naive, fp8, tf32.
std::optional<Policy> preset_policy(std::string_view name);
std::vector<std::string> preset_policy_names();
// A human-readable table of every point of a policy (logged with each arm).
std::string describe(const Policy& policy);

// The ops a policy's fp32_ops may name: layer_norm, softmax_cross_entropy,
// and the activations the table marks (numerics_layers.hpp).
std::vector<std::string> fp32_op_names();

}  // namespace mpsim::core
