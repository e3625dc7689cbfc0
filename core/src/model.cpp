#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "layer_table.hpp"
#include "mpsim/core/model.hpp"
#include "splitmix.hpp"

namespace mpsim::core {
namespace {

// Box-Muller on the specified generator: the same seed gives the same
// initial weights with any standard library.
double normal(SplitMix64& rng) {
  const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// The generator seed of parameter `index` of a model drawn from `seed`.
std::uint64_t mix(std::uint64_t seed, std::uint64_t index) {
  SplitMix64 g(seed ^ (index * 0xd1342543de82ef95ull));
  return g.next();
}

}  // namespace


namespace {
constexpr std::array<std::string_view, site_count> site_names{
    "input_operand", "weight_operand", "bias_operand", "output", "output_grad_operand", "weight_grad", "bias_grad",
    "input_grad",    "",               "weight_storage", "bias_storage", "weight_state1", "weight_state2",
    "bias_state1",   "bias_state2",    "output_sum",     "weight_grad_sum", "input_grad_sum",
    "fprop_activation_blocks", "fprop_weight_blocks", "dgrad_gradient_blocks", "dgrad_weight_blocks",
    "wgrad_gradient_blocks", "wgrad_activation_blocks", "wgrad_hadamard", "attention_scores", "attention_probs",
    "attention_probs_operand", "attention_probs_grad", "attention_scores_grad", "dropout_mask",
    "attention_dropout_mask", "attention_probs_dropped", "attention_probs_dropped_grad"};
}  // namespace

std::string_view to_string(Site site) { return site_names.at(static_cast<std::size_t>(site)); }

Site parameter_site(std::size_t index, ParameterRole role) {
  if (index > 1)
    throw std::invalid_argument("parameter " + std::to_string(index) +
                                " of a layer has no rounding site: layers have at most a weight and a bias");
  const bool weight = index == 0;
  switch (role) {
    case ParameterRole::operand: return weight ? Site::weight_operand : Site::bias_operand;
    case ParameterRole::storage: return weight ? Site::weight_storage : Site::bias_storage;
    case ParameterRole::state1: return weight ? Site::weight_state1 : Site::bias_state1;
    case ParameterRole::state2: return weight ? Site::weight_state2 : Site::bias_state2;
  }
  throw std::invalid_argument("unknown parameter role");
}

StepContext::StepContext(Backend& b, const Policy& p, std::uint64_t s) : backend(b), policy(p), seed(s) {}

StochasticStream StepContext::stream(Site site, std::int64_t at_step) const {
  StochasticStream s;
  s.key.seed = seed;
  s.key.stream = (static_cast<std::uint64_t>(layer) << 8) | static_cast<std::uint64_t>(site) |
                 (training ? 0 : (1ull << 40));
  s.first_index = static_cast<std::uint64_t>(at_step) << 32;  // tensors have fewer than 2^32 elements
  return s;
}

TensorStats* StepContext::stats_for(TensorKind kind) const {
  return stats ? &(*stats)[static_cast<std::size_t>(layer)][static_cast<int>(kind)] : nullptr;
}

GemmNumerics StepContext::gemm_numerics(GemmRole role, const RoundingPoint& a, const RoundingPoint& b) const {
  GemmNumerics n;
  n.a_format = a.format;
  n.b_format = b.format;
  n.accumulation = policy.accumulation;
  const BlockPoint& block_a = policy.*(block_points[block_point_index(role, 0)].point);
  const BlockPoint& block_b = policy.*(block_points[block_point_index(role, 1)].point);
  if (!block_a.enabled() || layer >= block_points_end) {
    n.model = gemm_model(policy, a, b);
    return n;
  }
  const auto operand = [&](const BlockPoint& point, int index) {
    const std::size_t slot = block_point_index(role, index);
    GemmNumerics::BlockOperand o;
    o.point = point;
    o.stream = stream(static_cast<Site>(static_cast<int>(Site::fprop_activation_blocks) + static_cast<int>(slot)));
    o.stats = block_stats ? &(*block_stats)[static_cast<std::size_t>(layer)][slot] : nullptr;
    return o;
  };
  n.a_block = operand(block_a, 0);
  n.b_block = operand(block_b, 1);
  n.block_promotion = block_promotion(policy, block_a.format);
  n.block_promotion_interval = policy.block_promotion_interval;
  const StochasticStream signs = stream(Site::wgrad_hadamard);
  n.hadamard_seed = signs.key.seed ^ (signs.key.stream * 0x9E3779B97F4A7C15ull) ^ signs.first_index;
  return n;
}

Tensor* StepContext::history(const RoundingPoint& point, Site site) {
  if (!point.delayed_scaling) return nullptr;
  auto [it, added] = amax_history_.try_emplace({layer, static_cast<int>(site)});
  if (added) it->second = backend.zeros({policy.delayed_scaling.history + 1});
  return &it->second;
}

void StepContext::round(Tensor& t, const RoundingPoint& point, std::optional<TensorKind> kind, Site site) {
  TensorStats* const counted = kind ? stats_for(*kind) : nullptr;
  if (point.is_identity() && counted == nullptr) return;
  // Delayed scaling (Transformer Engine): the scale comes from the amax of
  // earlier uses, on the backend (numerics.hpp's delayed_scale).
  if (Tensor* const ring = history(point, site))
    backend.round_delayed(t, point, *ring, policy.delayed_scaling.margin, training, stream(site), counted);
  else
    backend.round(t, point, 1.0f, stream(site), counted);
}

void StepContext::note_logit_max(const Tensor& logits) {
  if (logit_max) (*logit_max).at(static_cast<std::size_t>(layer)) = backend.max_abs_finite(logits);
}

void StepContext::note_output_logits(const Tensor& logits) {
  if (logit_max && layer == output_layer && !logit_max->empty()) logit_max->back() = backend.max_abs_finite(logits);
}

bool selected_gradient_passes(const Policy& policy, const std::optional<RoundingPoint>& output_grad) {
  return output_grad && policy.activation_grads.keeps_values_of(*output_grad);
}

void StepContext::round_state(Tensor& state, const RoundingPoint& point, Site site) {
  if (point.is_identity()) return;
  backend.round_state(state, point, history(point, site), policy.delayed_scaling.margin, stream(site));
}

namespace {

std::vector<std::unique_ptr<Layer>> build_layers(const ModelSpec& spec, const InputShape& in) {
  std::vector<std::unique_ptr<Layer>> layers;
  const std::string act(to_string(spec.activation));
  const auto activation = [&](const std::string& name) { return make_activation(name, spec.activation); };
  const auto norm = [&](const std::string& name, std::int64_t width) { return make_norm(name, spec, width); };
  if (spec.kind == ModelKind::mlp) {
    layers.push_back(make_flatten("flatten"));
    std::int64_t width = in.channels * in.height * in.width;
    int i = 1;
    for (const std::int64_t h : spec.hidden) {
      layers.push_back(make_linear("fc" + std::to_string(i), width, h));
      if (spec.layer_norm) layers.push_back(norm("ln" + std::to_string(i), h));
      layers.push_back(activation(act + std::to_string(i)));
      width = h;
      ++i;
    }
    layers.push_back(make_linear("fc" + std::to_string(i), width, in.classes));
  } else if (spec.kind == ModelKind::vit || spec.kind == ModelKind::gpt) {
    const std::int64_t d = spec.width;
    // The residual stream from the embedded tokens: learned positions (or rotary ones inside attention), the
    // embedding dropout, then pre-LayerNorm blocks (Xiong et al. 2020; GPT-2): x + attn(ln1(x)), then
    // x + mlp(ln2(x)).
    const auto blocks = [&](std::int64_t tokens, bool causal) {
      const auto optional = [&](layer_table::Slot slot, const std::string& block) {
        layer_table::add_layers(layers, {spec, slot, block, tokens});
      };
      optional(layer_table::Slot::after_embedding, "");
      for (std::int64_t l = 1; l <= spec.depth; ++l) {
        const std::string b = "block" + std::to_string(l) + ".";
        ResidualLayers attention = make_residual(b + "skip1", b + "add1");
        layers.push_back(std::move(attention.branch));
        layers.push_back(norm(b + "ln1", d));
        layers.push_back(make_linear(b + "qkv", d, 3 * d));
        optional(layer_table::Slot::after_qkv, b);
        layers.push_back(make_self_attention(b + "attn", tokens, spec.heads, causal,
                                             static_cast<float>(spec.attention_softcap), spec.attention_dropout,
                                             spec.fused_attention ? spec.attention_tile : 0));
        layers.push_back(make_linear(b + "proj", d, d));
        optional(layer_table::Slot::after_attention, b);
        layers.push_back(std::move(attention.add));
        ResidualLayers mlp = make_residual(b + "skip2", b + "add2");
        layers.push_back(std::move(mlp.branch));
        layers.push_back(norm(b + "ln2", d));
        // SwiGLU (Shazeer 2020; LLaMA): fc1 makes the gate and the value, the unit multiplies them.
        layers.push_back(make_linear(b + "fc1", d, spec.gated ? 2 * spec.mlp_width : spec.mlp_width));
        layers.push_back(spec.gated ? make_gated_activation(b + act + "_glu", spec.activation) : activation(b + act));
        layers.push_back(make_linear(b + "fc2", spec.mlp_width, d));
        optional(layer_table::Slot::after_mlp, b);
        layers.push_back(std::move(mlp.add));
      }
      layers.push_back(norm("ln", d));
    };
    if (spec.kind == ModelKind::vit) {
      // A Vision Transformer (Dosovitskiy et al. 2021) with learned position
      // embeddings and mean pooling over the patches (no class token, as
      // Beyer et al. 2022, "Better plain ViT baselines").
      const std::int64_t tokens = (in.height / spec.patch) * (in.width / spec.patch);
      layers.push_back(make_conv2d("patch", in.channels, d, spec.patch, spec.patch, 0));
      layers.push_back(make_tokens("tokens"));
      blocks(tokens, false);
      layers.push_back(make_sequence_mean("mean", tokens));
      layers.push_back(make_linear("head", d, in.classes));
    } else {
      // A decoder-only language model (Radford et al. 2018, GPT): token and
      // learned position embeddings, causal blocks, a head (tied to the token table with tie_embeddings) giving
      // every position's logits over the vocabulary (in.classes) for the
      // next token; the context is the input's width.
      const std::int64_t tokens = in.height * in.width;
      auto tie = spec.tie_embeddings ? std::make_shared<TiedTable>() : nullptr;
      layers.push_back(make_embedding("embed", in.classes, d, tie));
      blocks(tokens, true);
      layers.push_back(tie ? make_tied_linear("head", d, in.classes, tie) : make_linear("head", d, in.classes));
    }
    layer_table::add_layers(layers, {spec, layer_table::Slot::after_head, "", 0});
  } else {
    // LeNet-5 (LeCun et al. 1998) with ReLU and max pooling.
    layers.push_back(make_conv2d("conv1", in.channels, 6, 5, 1, 2));
    layers.push_back(activation(act + "1"));
    layers.push_back(make_max_pool2d("pool1", 2, 2));
    layers.push_back(make_conv2d("conv2", 6, 16, 5, 1, 0));
    layers.push_back(activation(act + "2"));
    layers.push_back(make_max_pool2d("pool2", 2, 2));
    layers.push_back(make_flatten("flatten"));
    // fc1's width: what the layers so far make of one image.
    Shape shape{1, in.channels, in.height, in.width};
    for (const auto& layer : layers) shape = layer->output_shape(shape);
    layers.push_back(make_linear("fc1", shape[1], 120));
    layers.push_back(activation(act + "3"));
    layers.push_back(make_linear("fc2", 120, 84));
    layers.push_back(activation(act + "4"));
    layers.push_back(make_linear("fc3", 84, in.classes));
  }
  return layers;
}

}  // namespace

Model::Model(const ModelSpec& spec, const InputShape& in, std::uint64_t seed) : layers_(build_layers(spec, in)) {
  initialize(parameters(), spec.init, spec.init_scale, seed, spec.zero_centered_gamma ? 0.0f : 1.0f);
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> all;
  for (auto& layer : layers_)
    for (Parameter* p : layer->parameters()) all.push_back(p);
  return all;
}

std::vector<std::string> Model::stat_names(const ModelSpec& spec, const InputShape& input) {
  std::vector<std::string> names;
  for (const auto& layer : build_layers(spec, input)) names.push_back(layer->name());
  names.push_back("loss");
  return names;
}

void initialize(std::vector<Parameter*> parameters, InitScheme scheme, double scale, std::uint64_t seed,
                float norm_gamma) {
  std::uint64_t index = 0;
  for (Parameter* p : parameters) {
    SplitMix64 rng(mix(seed, ++index));
    const std::int64_t n = element_count(p->shape);
    p->initial.assign(static_cast<std::size_t>(n), 0.0f);
    const bool is_bias = p->name.ends_with(".bias");
    const bool is_norm = p->shape.size() == 1 && !is_bias;  // LayerNorm gamma
    if (is_norm) std::fill(p->initial.begin(), p->initial.end(), norm_gamma);
    if (is_bias || is_norm) continue;
    const std::int64_t fan_out = p->shape[0], fan_in = n / fan_out;
    const std::int64_t receptive = p->shape.size() == 4 ? p->shape[2] * p->shape[3] : 1;
    for (auto& v : p->initial) {
      double x = 0.0;
      switch (scheme) {
        case InitScheme::he: x = normal(rng) * std::sqrt(2.0 / static_cast<double>(fan_in)); break;
        case InitScheme::xavier: {
          const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out * receptive));
          x = (2.0 * rng.uniform() - 1.0) * limit;
          break;
        }
        case InitScheme::normal: x = normal(rng); break;
      }
      v = static_cast<float>(x * scale);
    }
  }
}

}  // namespace mpsim::core
