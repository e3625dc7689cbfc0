#include "mpsim/core/policy.hpp"
#include "mpsim/core/numerics_layers.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace mpsim::core {
namespace {

RoundingPoint point(const Format& f, bool scaled = false) {
  RoundingPoint p;
  p.format = f;
  p.delayed_scaling = scaled;
  return p;
}

}  // namespace

bool RoundingPoint::is_identity() const {
  return format == formats::binary32 && !delayed_scaling && rounding.mode == RoundingMode::nearest_even;
}

bool RoundingPoint::keeps_values_of(const RoundingPoint& earlier) const {
  return is_identity() || (!delayed_scaling && !earlier.delayed_scaling && format == earlier.format);
}

std::optional<RoundingPoint> parse_rounding_point(std::string_view text, std::string* error) {
  RoundingPoint p;
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t slash = text.find('/', start);
    parts.push_back(text.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  const auto fail = [&](std::string message) -> std::optional<RoundingPoint> {
    if (error) *error = std::move(message);
    return std::nullopt;
  };
  const auto format = parse_format(parts[0]);
  if (!format)
    return fail("unknown format '" + std::string(parts[0]) + "'; expected " + std::string(format_names()) +
                " or eXmY[:ftz][:sat][:fn]");
  if (!fits_in_float(*format))
    return fail("format '" + std::string(parts[0]) + "' does not fit in binary32; training tensors are binary32");
  p.format = *format;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (parts[i] == "scaled") {
      p.delayed_scaling = true;
    } else if (const auto mode = parse_rounding_mode(parts[i])) {
      p.rounding.mode = *mode;
    } else {
      return fail("unknown rounding '" + std::string(parts[i]) + "' in '" + std::string(text) + "'; expected " +
                  std::string(rounding_mode_names()) + " or scaled");
    }
  }
  return p;
}

std::string to_string(const RoundingPoint& p) {
  std::string s = p.format.name();
  if (p.rounding.mode != RoundingMode::nearest_even) s += "/" + std::string(to_string(p.rounding.mode));
  if (p.delayed_scaling) s += "/scaled";
  return s;
}


std::optional<AccumulationModel> gemm_model(const Policy& p, const RoundingPoint& a, const RoundingPoint& b) {
  if (p.gemm == "ieee") return std::nullopt;
  if (!p.accumulation.is_identity())
    throw std::invalid_argument("gemm = \"" + p.gemm + "\" replaces the accumulation rounding; set accumulation = "
                                "\"binary32\" or gemm = \"ieee\"");
  auto model = parse_accumulation_model(p.gemm, a.format);
  if (!model)
    throw std::invalid_argument("gemm = \"" + p.gemm + "\" is not an accumulation model for " + a.format.name() +
                                " operands; accepted: ieee, " + std::string(accumulation_model_names()));
  if (model->kind == AccumulationKind::tensor_core && (a.format != b.format || a.delayed_scaling || b.delayed_scaling))
    throw std::invalid_argument("gemm = \"" + p.gemm + "\" models one tensor-core input format, but a GEMM multiplies " +
                                to_string(a) + " by " + to_string(b) +
                                " operands; give activations, weights and gradient_operands one unscaled format");
  return model;
}

bool Policy::runs_in_fp32(std::string_view op) const {
  return std::find(fp32_ops.begin(), fp32_ops.end(), op) != fp32_ops.end();
}

std::vector<std::string> preset_policy_names() {
  return {"fp32", "fp16-mixed", "bf16-mixed", "fp16-naive", "fp8", "tf32"};
}

std::optional<Policy> preset_policy(std::string_view name) {
  Policy p;
  p.name = std::string(name);
  if (name == "fp32") return p;
  if (name == "tf32") {
    // FP32 training whose GEMM operands are TF32 (Ampere and later with
    // TF32 allowed: torch.backends.cuda.matmul.allow_tf32): binary32's range
    // with 11 significant bits, binary32 accumulation. The FP32 reference
    // (`fp32`) keeps TF32 off.
    p.weights = p.activations = p.gradient_operands = point(formats::tf32);
    return p;
  }
  // Mixed precision (Micikevicius et al. 2018; PyTorch autocast): low-precision
  // GEMM operands and activations, FP32 accumulation, master weights and
  // optimiser state; normalisation and the loss in FP32.
  const auto mixed = [&](const Format& f) {
    p.weights = p.activations = p.gemm_output = p.elementwise = point(f);
    p.gradient_operands = p.activation_grads = p.weight_grads = point(f);
    p.fp32_ops = {"layer_norm", "softmax_cross_entropy"};
  };
  if (name == "fp16-mixed") {
    mixed(formats::binary16);
    p.loss_scaling.mode = LossScaleMode::dynamic;
    return p;
  }
  if (name == "bf16-mixed") {
    mixed(formats::bfloat16);
    return p;
  }
  if (name == "fp16-naive") {
    // Every tensor stored in FP16, the weights included (no master copy), no
    // loss scaling. GEMMs accumulate in FP32 as FP16 tensor-core GEMMs do
    // (what model.half() gets from cuBLAS); set accumulation = "binary16" for
    // rounding after every addition.
    mixed(formats::binary16);
    p.fp32_ops = {"softmax_cross_entropy"};
    p.master_weights = false;
    p.weight_storage = p.optimizer_state = point(formats::binary16);
    return p;
  }
  if (name == "fp8") {
    // Transformer Engine's recipe: E4M3 forward operands, E5M2 gradients, each
    // tensor scaled from its amax history; BF16 elsewhere; FP32 master weights.
    mixed(formats::bfloat16);
    p.weights = p.activations = point(formats::e4m3, true);
    // Scaled values that outgrow the history saturate, as TE's casts do
    // (cvt.rn.satfinite on Hopper), instead of becoming infinity.
    Format e5m2_saturating = formats::e5m2;
    e5m2_saturating.overflow = Overflow::saturate;
    p.gradient_operands = point(e5m2_saturating, true);
    return p;
  }
  return std::nullopt;
}

std::string describe(const Policy& p) {
  std::ostringstream out;
  out << "policy " << p.name << "\n";
  for (const auto& [name, point, doc] : rounding_points) {
    if (name == "weight_storage") out << "master_weights = " << (p.master_weights ? "true" : "false") << "\n";
    out << name << " = " << to_string(p.*point) << "\n";
  }
  out << "gemm = " << p.gemm << "\n";
  out << "fp32_ops = [";
  for (std::size_t i = 0; i < p.fp32_ops.size(); ++i) out << (i ? ", " : "") << '"' << p.fp32_ops[i] << '"';
  out << "]\n";
  const auto& s = p.loss_scaling;
  out << "loss_scale.mode = " << to_string(s.mode) << "\n";
  if (s.mode != LossScaleMode::none) out << "loss_scale.initial = " << s.initial_scale << "\n";
  if (s.mode == LossScaleMode::dynamic)
    out << "loss_scale.growth_factor = " << s.growth_factor << "\nloss_scale.backoff_factor = " << s.backoff_factor
        << "\nloss_scale.growth_interval = " << s.growth_interval << "\nloss_scale.hysteresis = " << s.hysteresis
        << "\nloss_scale.min = " << s.min_scale << "\nloss_scale.max = " << s.max_scale << "\n";
  out << "delayed_scaling.history = " << p.delayed_scaling.history
      << "\ndelayed_scaling.margin = " << p.delayed_scaling.margin << "\n";
  return out.str();
}

}  // namespace mpsim::core
