#include "mpsim/core/policy.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/emulation/pattern_format.hpp"

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

// "a/b/c" -> {"a", "b", "c"}: a point's format and its modifiers.
std::vector<std::string_view> slash_parts(std::string_view text) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t slash = text.find('/', start);
    parts.push_back(text.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start));
    if (slash == std::string_view::npos) return parts;
    start = slash + 1;
  }
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
  const std::vector<std::string_view> parts = slash_parts(text);
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

std::optional<BlockPoint> parse_block_point(std::string_view text, std::string* error) {
  BlockPoint p;
  if (text.empty() || text == "none") return p;
  const auto fail = [&](std::string message) -> std::optional<BlockPoint> {
    if (error) *error = std::move(message);
    return std::nullopt;
  };
  const std::vector<std::string_view> parts = slash_parts(text);
  const auto format = parse_block_format(parts[0]);
  if (!format)
    return fail("unknown block format '" + std::string(parts[0]) + "'; expected none or one of " +
                std::string(block_format_names()));
  p.preset = std::string(parts[0]);
  p.format = *format;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string_view part = parts[i];
    if (part == "rht") {
      p.hadamard = true;
    } else if (part == "floor" || part == "ceil") {
      // OCP's power-of-two scale (E8M0) in place of the preset's.
      if (!format->element.floating)
        return fail("'" + std::string(text) + "': /" + std::string(part) + " takes floating-point elements");
      p.scale_rule = std::string(part);
      p.format.scale = ScaleFormat::e8m0;
      p.format.rule = part == "floor" ? ScaleRule::ocp_floor : ScaleRule::ceil;
    } else if (part == "nvfp4-te") {
      if (format->rule != ScaleRule::nvfp4)
        return fail("'" + std::string(text) + "': /nvfp4-te (Transformer Engine's order of the NVFP4 scale) takes "
                    "nvfp4 formats");
      p.scale_rule = "nvfp4-te";
      p.format.rule = ScaleRule::nvfp4_te;
    } else if (const auto mode = parse_rounding_mode(part);
               mode && (*mode == RoundingMode::nearest_even || *mode == RoundingMode::stochastic)) {
      p.rounding.mode = *mode;
    } else {
      return fail("unknown part '" + std::string(part) + "' in '" + std::string(text) +
                  "'; expected nearest-even, stochastic, rht, floor, ceil or nvfp4-te");
    }
  }
  return p;
}

std::string to_string(const BlockPoint& p) {
  if (!p.enabled()) return "none";
  std::string s = p.preset;
  if (p.rounding.mode != RoundingMode::nearest_even) s += "/" + std::string(to_string(p.rounding.mode));
  if (p.hadamard) s += "/rht";
  if (!p.scale_rule.empty()) s += "/" + p.scale_rule;
  return s;
}

bool uses_block_formats(const Policy& p) {
  return std::any_of(block_points.begin(), block_points.end(),
                     [&](const NamedBlockPoint& b) { return (p.*(b.point)).enabled(); });
}

void check_block_points(const Policy& p) {
  for (const GemmRole role : {GemmRole::fprop, GemmRole::dgrad, GemmRole::wgrad}) {
    const NamedBlockPoint& na = block_points[block_point_index(role, 0)];
    const NamedBlockPoint& nb = block_points[block_point_index(role, 1)];
    const BlockPoint& a = p.*(na.point);
    const BlockPoint& b = p.*(nb.point);
    const auto pair = std::string(na.name) + " = \"" + to_string(a) + "\" and " + std::string(nb.name) + " = \"" +
                      to_string(b) + "\"";
    if (a.enabled() != b.enabled())
      throw std::invalid_argument(pair + ": a block-scaled GEMM takes two block-scaled operands; give both a block "
                                  "format or neither");
    if (!a.enabled()) continue;
    const bool whole_a = a.format.block_cols == 0, whole_b = b.format.block_cols == 0;
    if (whole_a != whole_b || a.format.block_cols != b.format.block_cols)
      throw std::invalid_argument(pair + ": the operands' blocks along k differ in length (" +
                                  std::to_string(a.format.block_cols) + " and " + std::to_string(b.format.block_cols) +
                                  "; 0 is the whole tensor); the hardware multiplies block by block");
    if (a.hadamard != b.hadamard)
      throw std::invalid_argument(pair + ": the Hadamard transform (/rht) must be on both operands, or the product "
                                  "changes");
    if (a.hadamard && a.format.block_cols % 16 != 0)
      throw std::invalid_argument(pair + ": /rht needs blocks along k that are multiples of 16");
    if (!p.accumulation.is_identity())
      throw std::invalid_argument(pair + ": block-scaled GEMMs accumulate as `gemm` says; set accumulation = "
                                  "\"binary32\"");
    const bool software_scales = a.format.scale == ScaleFormat::binary32 || b.format.scale == ScaleFormat::binary32;
    if (p.gemm != "ieee") {
      const bool floating = a.format.element.floating && b.format.element.floating;
      const auto model = floating ? parse_accumulation_model(p.gemm, *a.format.element.floating) : std::nullopt;
      const bool fp8 = floating && a.format.element.floating->total_bits() == 8 &&
                       b.format.element.floating->total_bits() == 8;
      if (!model || model->kind != AccumulationKind::tensor_core || (software_scales && !fp8))
        throw std::invalid_argument(pair + ": gemm = \"" + p.gemm + "\" cannot sum block-scaled operands; use "
                                    "\"ieee\" (exact block sums, binary32 across blocks) or a tensor-core model "
                                    "with a preset for the element format (E8M0/UE4M3 scales: the scaled products "
                                    "in its accumulator) or, for binary32 scales, FP8 elements (DeepSeek-V3's "
                                    "promotion)");
      if (software_scales && p.block_promotion_interval != 0)
        throw std::invalid_argument(pair + ": binary32 (software) block scales promote once per block; set "
                                    "block_promotion_interval = 0");
      if (!software_scales && a.format.block_cols > 0 && p.block_promotion_interval % a.format.block_cols != 0)
        throw std::invalid_argument(pair + ": block_promotion_interval = " +
                                    std::to_string(p.block_promotion_interval) + " is not a multiple of the block "
                                    "length along k (" + std::to_string(a.format.block_cols) + ")");
    } else if (p.block_promotion_interval != 0) {
      throw std::invalid_argument(pair + ": block_promotion_interval needs a tensor-core gemm model (gemm = \"ieee\" "
                                  "sums blocks exactly); set it to 0 or choose a gemm model such as \"b200\"");
    }
  }
}

std::optional<TensorCoreModel> block_promotion(const Policy& p, const BlockFormat& a) {
  if (p.gemm == "ieee") return std::nullopt;
  const auto tc = parse_accumulation_model(p.gemm, a.element.floating.value_or(formats::e4m3));
  if (!tc || tc->kind != AccumulationKind::tensor_core)
    throw std::invalid_argument("gemm = \"" + p.gemm + "\" cannot sum block-scaled operands");
  return tc->tensor_core;
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

InternalRounding internal_rounding(const Policy& p, const RoundingPoint Policy::*point, std::string_view op) {
  const RoundingPoint& r = p.*point;
  if (r.delayed_scaling || r.rounding.mode == RoundingMode::stochastic) {
    std::string_view key = "internal point";
    for (const auto& named : rounding_points)
      if (named.point == point) key = named.name;
    throw std::invalid_argument(std::string(key) + " = \"" + to_string(r) + "\": the internal arithmetic of " +
                                std::string(op) + " has no tensor to scale and no stream of random draws; use a " +
                                "deterministic rounding without /scaled (for example \"bfloat16\")");
  }
  if (r.is_identity() || p.runs_in_fp32(op)) return {};
  return {true, binary64_pattern_format(r.format), pattern_rounding(r.rounding)};
}

bool Policy::runs_in_fp32(std::string_view op) const {
  return std::find(fp32_ops.begin(), fp32_ops.end(), op) != fp32_ops.end();
}

std::vector<std::string> preset_policy_names() {
  return {"fp32",         "fp16-mixed", "bf16-mixed", "fp16-naive", "fp8", "fp8-delayed", "fp8-current",
          "mxfp8",        "nvfp4",      "deepseek-fp8", "tf32"};
}

namespace {

BlockPoint block(std::string_view text) {
  std::string error;
  const auto p = parse_block_point(text, &error);
  if (!p) throw std::logic_error("preset block point: " + error);
  return *p;
}

void set_role(Policy& p, GemmRole role, const BlockPoint& a, const BlockPoint& b) {
  p.*(block_points[block_point_index(role, 0)].point) = a;
  p.*(block_points[block_point_index(role, 1)].point) = b;
}

}  // namespace

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
  // optimiser state; normalisation, attention's softmax, the residual
  // stream (a binary32 sum where autocast adds a low-precision branch to a
  // binary32 stream) and the loss in FP32.
  const auto mixed = [&](const Format& f) {
    p.weights = p.activations = p.gemm_output = p.elementwise = point(f);
    p.gradient_operands = p.activation_grads = p.weight_grads = point(f);
    p.fp32_ops = {"layer_norm", "softmax", "residual", "softmax_cross_entropy"};
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
  if (name == "fp8-current") {
    // Transformer Engine's Float8CurrentScaling (HYBRID): every GEMM operand
    // scaled per tensor by its own amax just before the GEMM, E4M3 forward
    // and E5M2 for gradients; one binary32 scale amax / largest per tensor
    // (TE computes largest / amax and multiplies: docs/policies.md); BF16
    // elsewhere, FP32 master weights.
    mixed(formats::bfloat16);
    const BlockPoint e4m3 = block("fp8-e4m3-tensor"), e5m2 = block("fp8-e5m2-tensor");
    set_role(p, GemmRole::fprop, e4m3, e4m3);
    set_role(p, GemmRole::dgrad, e5m2, e4m3);
    set_role(p, GemmRole::wgrad, e5m2, e4m3);
    return p;
  }
  if (name == "mxfp8") {
    // MXFP8 for every GEMM operand, E4M3 elements with the rounded-up
    // power-of-two scale that never saturates (Mishra et al., "Recipes for
    // Pre-training LLMs with MXFP8", arXiv 2506.08027; Transformer Engine's
    // MXFP8BlockScaling); BF16 elsewhere, FP32 master weights.
    mixed(formats::bfloat16);
    const BlockPoint e4m3 = block("mxfp8-e4m3/ceil");
    for (const GemmRole role : {GemmRole::fprop, GemmRole::dgrad, GemmRole::wgrad}) set_role(p, role, e4m3, e4m3);
    return p;
  }
  if (name == "nvfp4") {
    // NVIDIA's NVFP4 recipe (arXiv 2509.25149, §4): NVFP4 for every GEMM's
    // operands, weights in 16 x 16 tiles, stochastic rounding on gradients,
    // a random Hadamard transform on the weight-gradient GEMM's inputs, the
    // last layer in BF16; BF16 elsewhere, FP32 master weights.
    mixed(formats::bfloat16);
    set_role(p, GemmRole::fprop, block("nvfp4"), block("nvfp4-16x16"));
    set_role(p, GemmRole::dgrad, block("nvfp4/stochastic"), block("nvfp4-16x16"));
    set_role(p, GemmRole::wgrad, block("nvfp4/stochastic/rht"), block("nvfp4/rht"));
    p.high_precision_last = 1;
    return p;
  }
  if (name == "deepseek-fp8") {
    // DeepSeek-V3 (arXiv 2412.19437, §3.3): E4M3 everywhere, 1 x 128 tiles
    // for activations and gradients, 128 x 128 for weights, binary32 scales
    // amax / 448; the H100's FP8 tensor-core sums promoted to binary32 every
    // 128 products; BF16 optimizer moments, FP32 master weights.
    mixed(formats::bfloat16);
    const BlockPoint row = block("fp8-e4m3-1x128"), tile = block("fp8-e4m3-128x128");
    set_role(p, GemmRole::fprop, row, tile);
    set_role(p, GemmRole::dgrad, row, tile);
    set_role(p, GemmRole::wgrad, row, row);
    p.gemm = "h100";
    p.optimizer_state = point(formats::bfloat16);
    return p;
  }
  if (name == "fp8" || name == "fp8-delayed") {
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
  for (const auto& b : block_points) out << b.name << " = " << to_string(p.*(b.point)) << "\n";
  out << "high_precision_last = " << p.high_precision_last << "\n";
  out << "block_promotion_interval = " << p.block_promotion_interval << "\n";
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
