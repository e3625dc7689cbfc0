#pragma once
// Layers with explicit backward passes, written once against Backend. Each
// layer rounds its results at the points the Policy names, through
// StepContext::round, which also routes the instrumentation.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/numerics_ops.hpp"
#include "mpsim/core/backend.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/run_log.hpp"

namespace mpsim::core {

// A trainable tensor. `master` holds the weights as the optimiser keeps them:
// binary32 with master weights, else values of policy.weight_storage.
// `working` is the copy the forward and backward passes read (policy.weights).
struct Parameter {
  std::string name;
  Shape shape;
  std::vector<float> initial;  // host values the arm starts from (binary32)
  Tensor master, working, grad, state1, state2;
};

// Every tensor a layer rounds, one value each: with the layer index (and
// whether the step trains) it is the tensor's identity, which keys its
// stochastic stream and its delayed-scaling amax history (StepContext). Two
// tensors never share an identity, so they never share random draws or a
// scale. The first eight values are the stream keys logs were made with
// before the parameters' storage and optimiser state got their own sites;
// they must not be renumbered (same config, same bits).
enum class Site : std::uint8_t {
  input_operand, weight_operand, bias_operand, output, output_grad_operand, weight_grad, bias_grad, input_grad,
  // 8 was one site shared by all optimiser state of a layer: unused since.
  weight_storage = 9, bias_storage,  // the stored weights (no master copy): rounded at the start and by each update
  weight_state1, weight_state2, bias_state1, bias_state2,  // SGD momentum, Adam's m and v
  // The running sums of a GEMM whose accumulation rounds (stochastically, say)
  // after every addition, apart from the rounding of the result itself.
  output_sum, weight_grad_sum, input_grad_sum,
  // Block-scaled GEMM operands (policy.hpp's block_points, in that order),
  // and the signs of a weight-gradient GEMM's Hadamard transform.
  fprop_activation_blocks, fprop_weight_blocks, dgrad_gradient_blocks, dgrad_weight_blocks,
  wgrad_gradient_blocks, wgrad_activation_blocks, wgrad_hadamard,
  // Self-attention's inner tensors: the logits, the probabilities (and their
  // copy as the second GEMM's operand), and the gradients of both.
  attention_scores, attention_probs, attention_probs_operand, attention_probs_grad, attention_scores_grad,
  // Dropout's masks: a dropout layer's, and self-attention's on its probabilities;
  // the dropped probabilities and their gradient.
  dropout_mask, attention_dropout_mask, attention_probs_dropped, attention_probs_dropped_grad,
};
inline constexpr int site_count = 34;
// The sites' names, for messages and logs ("" for the unused value).
std::string_view to_string(Site site);

// What the optimiser keeps of a parameter, each rounded on its own.
enum class ParameterRole : std::uint8_t { operand, storage, state1, state2 };
// The site of parameter `index` of a layer (0: its weight, 1: its bias, as
// Layer::parameters orders them) in `role`: the one place a parameter's
// tensors get their identities. Throws for an index above 1.
Site parameter_site(std::size_t index, ParameterRole role);

class StepContext {
 public:
  StepContext(Backend& backend, const Policy& policy, std::uint64_t seed);

  Backend& backend;
  const Policy& policy;
  std::uint64_t seed;
  std::int64_t step = 0;
  bool training = true;
  LayerStats* stats = nullptr;  // null: no instrumentation this step
  int layer = 0;
  // The rounding point that the values entering the current layer passed
  // last (forward: its input; backward: its output gradient), when the loop
  // knows it. A GEMM operand rounding that keeps those values is skipped.
  std::optional<RoundingPoint> incoming;
  // Block statistics of the GEMM operands (null: no instrumentation this
  // step), and the first layer that ignores the block points
  // (Policy::high_precision_last; the trainer sets it).
  LayerBlockStats* block_stats = nullptr;
  // The largest finite |logit| per layer (NaN where a layer has none), at
  // the steps that keep statistics (null at the others): the attention
  // logits' maxima and, in the "loss" row, the output logits' (Wortsman et
  // al. 2023 follow both to see a run diverge).
  std::vector<double>* logit_max = nullptr;
  int output_layer = -1;  // the layer whose GEMM makes the model's logits: the last with parameters (the trainer sets it)
  bool attention_stats = false;  // TrainSpec::attention_stats (the trainer sets it)
  int block_points_end = std::numeric_limits<int>::max();

  // Rounds t in place at `point`, scaling per tensor when the point asks,
  // counting into stats[layer][kind]; nothing is counted without a kind
  // (optimiser state is not one of the instrumented kinds).
  void round(Tensor& t, const RoundingPoint& point, std::optional<TensorKind> kind, Site site);
  // Rounds optimiser state at `point` after the step's optimiser step, which
  // a skipped step leaves as it was (Backend::round_state).
  void round_state(Tensor& state, const RoundingPoint& point, Site site);
  // Keeps max |logits| (finite values) as the current layer's logit maximum
  // when this step logs them.
  void note_logit_max(const Tensor& logits);
  // The same for the model's output logits, kept in the last row ("loss"),
  // when the current layer is output_layer: a layer calls it before it
  // rounds its output, so the maximum is the binary32 logits'.
  void note_output_logits(const Tensor& logits);
  // A stochastic stream unique to (seed, layer, site, step): the one place a
  // tensor's identity becomes its random draws.
  StochasticStream stream(Site site) const { return stream(site, step); }
  // The same at another step: an optimiser step's update writes the weights
  // of the next step, so their storage rounding draws as step + 1 (the
  // initial weights draw as step 0).
  StochasticStream stream(Site site, std::int64_t at_step) const;
  TensorStats* stats_for(TensorKind kind) const;
  // How the current layer's GEMM in `role` computes, with operands rounded
  // at the per-tensor points a and b: its accumulation model, or its
  // block-scaled operands with their streams and statistics.
  GemmNumerics gemm_numerics(GemmRole role, const RoundingPoint& a, const RoundingPoint& b) const;

 private:
  // The amax ring of each delayed-scaled (layer, site), a backend tensor
  // (Backend::round_delayed); null when the point is not scaled.
  Tensor* history(const RoundingPoint& point, Site site);
  std::map<std::pair<int, int>, Tensor> amax_history_;
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  const std::string& name() const { return name_; }
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual Tensor forward(StepContext& ctx, const Tensor& x) = 0;
  // need_input_grad is false for the first layer: its input gradient is never used.
  virtual Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }
  // The rounding point the forward output passes last, given the input's
  // (nullopt: unknown).
  virtual std::optional<RoundingPoint> output_rounding(const Policy& policy,
                                                       const std::optional<RoundingPoint>& input) const = 0;
  // The same for the gradient backward returns. Every layer that computes
  // its input gradient rounds it last at policy.activation_grads; a layer
  // that passes the gradient through (Flatten) or selects from it (ReLU,
  // max pooling: selected_gradient_passes below) overrides this.
  virtual std::optional<RoundingPoint> input_grad_rounding(const Policy& policy,
                                                           const std::optional<RoundingPoint>& /*output_grad*/) const {
    return policy.activation_grads;
  }

 private:
  std::string name_;
};

// Whether a layer whose input gradient only selects values of its output
// gradient (each value dy's or zero: ReLU, non-overlapping max pooling) may
// leave that gradient unrounded and uncounted: when dy already passed
// `output_grad` and rounding at the policy's activation_grads would keep every
// value (RoundingPoint::keeps_values_of). Counting those values again would
// count one tensor twice in every aggregate over layers (issue 21, section 1:
// each tensor is counted once, where the policy rounds it).
bool selected_gradient_passes(const Policy& policy, const std::optional<RoundingPoint>& output_grad);

// Activation and its names: the table in numerics_layers.hpp.
enum class InitScheme : std::uint8_t { he, xavier, normal };
// cnn: LeNet-5 style; vit: a Vision Transformer; gpt: a decoder-only
// character-level language model (model.cpp's build_layers).
enum class ModelKind : std::uint8_t { mlp, cnn, vit, gpt };
// The normalisation layers a model builds: LayerNorm, or RMSNorm (LLaMA's).
enum class NormKind : std::uint8_t { layer_norm, rms_norm };
inline constexpr EnumNames<NormKind, 2> norm_kind_names{{"layernorm", "rmsnorm"}};
inline std::string_view to_string(NormKind kind) { return norm_kind_names(kind); }
// How a transformer knows positions: a learned table added to the input
// rows, or rotary embeddings of q and k in every attention (RoFormer; LLaMA).
enum class PositionKind : std::uint8_t { learned, rotary };
inline constexpr EnumNames<PositionKind, 2> position_kind_names{{"learned", "rotary"}};
inline std::string_view to_string(PositionKind kind) { return position_kind_names(kind); }
inline constexpr EnumNames<ModelKind, 4> model_kind_names{{"mlp", "cnn", "vit", "gpt"}};  // the config's names
inline std::string_view to_string(ModelKind kind) { return model_kind_names(kind); }
inline constexpr EnumNames<InitScheme, 3> init_scheme_names{{"he", "xavier", "normal"}};
inline std::string_view to_string(InitScheme scheme) { return init_scheme_names(scheme); }

struct ModelSpec {
  ModelKind kind = ModelKind::mlp;
  std::vector<std::int64_t> hidden{256, 256};  // MLP widths
  Activation activation = Activation::relu;
  bool layer_norm = false;            // MLP: LayerNorm after every hidden Linear
  NormKind norm = NormKind::layer_norm;  // every norm layer the model builds (the MLP's, a transformer's)
  bool zero_centered_gamma = false;   // every norm scales by 1 + gamma, gamma starting at 0 (norm_scale)
  // Transformers (vit, gpt): the ViT's patch side, blocks, model width,
  // attention heads (width / heads each) and the MLP's hidden width.
  std::int64_t patch = 7, depth = 4, width = 64, heads = 4, mlp_width = 128;
  bool qk_norm = false;               // vit, gpt: QK-LayerNorm between each qkv Linear and its attention
  bool gated = false;                 // vit, gpt: the block MLP as a gated linear unit of `activation` (silu: SwiGLU)
  PositionKind positions = PositionKind::learned;  // vit, gpt
  bool tie_embeddings = false;        // gpt: the head's weight is the token table (GPT-2)
  double dropout = 0.0;               // vit, gpt: after the embeddings and each block's two branches (GPT-2)
  double attention_dropout = 0.0;     // vit, gpt: on the attention probabilities
  double rotary_base = 10000.0;       // vit, gpt with rotary positions: theta_c = base^(-2c/head_dim)
  double attention_softcap = 0.0;     // vit, gpt: > 0 caps the attention logits at +-this (Gemma 2: 50)
  bool fused_attention = false;       // vit, gpt: FlashAttention-2's fused path (numerics_attention.hpp)
  std::int64_t attention_tile = 64;   // vit, gpt with fused_attention: keys per tile
  double logit_softcap = 0.0;         // vit, gpt: > 0 caps the output logits at +-this (Gemma 2: 30)
  double embedding_scale = 0.0;       // vit, gpt: > 0 multiplies the embedded rows by this (Gemma: sqrt(width))
  bool post_norm = false;             // vit, gpt: a norm on each block's two branch outputs (Gemma 2's sandwich)
  InitScheme init = InitScheme::he;
  double init_scale = 1.0;            // multiplies every initial weight: small weights, small gradients
};

struct InputShape {
  std::int64_t channels = 1, height = 28, width = 28, classes = 10;
};

class Model {
 public:
  // Builds the layers and draws the initial weights from seed (same seed, same bits).
  Model(const ModelSpec& spec, const InputShape& input, std::uint64_t seed);
  std::vector<std::unique_ptr<Layer>>& layers() { return layers_; }
  std::vector<Parameter*> parameters();
  // Layer names, then "loss" (where the gradient of the logits is counted),
  // without building and initialising a model's weights.
  static std::vector<std::string> stat_names(const ModelSpec& spec, const InputShape& input);

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
};

// Individual layers, for tests and custom models.
std::unique_ptr<Layer> make_linear(std::string name, std::int64_t in, std::int64_t out);
std::unique_ptr<Layer> make_conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels,
                                   std::int64_t kernel, std::int64_t stride, std::int64_t padding);
std::unique_ptr<Layer> make_max_pool2d(std::string name, std::int64_t kernel, std::int64_t stride);
std::unique_ptr<Layer> make_flatten(std::string name);
// A layer of any entry of the element-wise table (numerics_ops.hpp): `op`
// is the entry and its parameters, unless `per_step` gives each step's (or
// nothing: the layer passes its input, and its gradient, through, as dropout
// does in evaluation). Its output rounds at the policy's `elementwise`, not
// at all (`binary32`: counted as binary32), or as autocast rounds it
// (`autocast`: binary32 when the entry is an fp32_op that the policy's
// fp32_ops lists, else `elementwise`); its input gradient at activation_grads.
enum class PointwiseOutput : std::uint8_t { elementwise, binary32, autocast };
struct PointwiseLayerSpec {
  PointwiseCall op;
  PointwiseOutput output = PointwiseOutput::elementwise;
  std::function<std::optional<PointwiseCall>(const StepContext&)> per_step;
};
std::unique_ptr<Layer> make_pointwise(std::string name, PointwiseLayerSpec spec);
// Any activation of the table (numerics_layers.hpp).
std::unique_ptr<Layer> make_activation(std::string name, Activation kind);
// A gated linear unit: rows of [a | b] -> activation(a) * b (SiLU: SwiGLU).
std::unique_ptr<Layer> make_gated_activation(std::string name, Activation kind);
// A layer of any entry of the row-wise table (numerics_rows.hpp): `call`
// gives the entry and its parameters under a policy, `layout` the segments of
// an input (throwing for an input that does not fit). Its parameters are a
// weight and, with `bias`, a bias (the entry's first and second), each of
// parameter_shape; the output rounds at the policy's elementwise point, or not
// at all when its fp32_ops lists the entry's fp32_op; the parameters'
// gradients at weight_grads, the input gradient at activation_grads.
struct RowLayerSpec {
  std::function<RowCall(const Policy&)> call;
  std::function<RowLayout(const Tensor&)> layout;
  Shape parameter_shape;
  bool bias = true;
};
std::unique_ptr<Layer> make_row_layer(std::string name, RowLayerSpec spec);
// With zero_centered the scale is 1 + gamma (numerics_layers.hpp's norm_scale).
std::unique_ptr<Layer> make_layer_norm(std::string name, std::int64_t features, float eps = 1e-5f,
                                       bool zero_centered = false);
std::unique_ptr<Layer> make_rms_norm(std::string name, std::int64_t features, float eps = 1e-5f,
                                     bool zero_centered = false);
// The spec's norm (model.norm, model.zero_centered_gamma) over rows of `features` values.
std::unique_ptr<Layer> make_norm(std::string name, const ModelSpec& spec, std::int64_t features);
// A tied output head (Press and Wolf 2017; GPT-2): the head's weight is the
// token table, one parameter that the embedding owns. The head writes its
// part of the gradient (rounded at its own weight_grad site) into head_grad;
// the embedding, whose backward runs later, adds it to its own and rounds the
// sum at its weight_grad site.
struct TiedTable {
  Parameter* table = nullptr;  // the embedding's
  Tensor head_grad;
};
// Transformers (layers_transformer.cpp). Token ids -> rows of a [vocabulary, width] table.
std::unique_ptr<Layer> make_embedding(std::string name, std::int64_t vocabulary, std::int64_t width,
                                      std::shared_ptr<TiedTable> tie = nullptr);
// A Linear whose weight is tie->table ([out, in] = the table's [vocabulary, width]); its only parameter is
// its bias (the bias keys its sites as its layer's parameter 0).
std::unique_ptr<Layer> make_tied_linear(std::string name, std::int64_t in, std::int64_t out,
                                        std::shared_ptr<TiedTable> tie);
// NCHW maps -> a row per position.
std::unique_ptr<Layer> make_tokens(std::string name);
// Adds a learned [tokens, width] table to each sample's rows.
std::unique_ptr<Layer> make_position_embedding(std::string name, std::int64_t tokens, std::int64_t width);
// y = x + f(x): `branch` goes before f's layers (it keeps x), `add` after them.
struct ResidualLayers {
  std::unique_ptr<Layer> branch, add;
};
ResidualLayers make_residual(const std::string& branch_name, const std::string& add_name);
// Multi-head self-attention on [q | k | v] rows of 3 x width values (numerics_attention.hpp);
// softcap > 0 caps the logits at +-softcap (soft_cap) before the softmax;
// fused_tile > 0 runs FlashAttention-2's fused path with tiles of that many
// keys (FusedAttention; dropout there drops the unfused path's elements).
std::unique_ptr<Layer> make_self_attention(std::string name, std::int64_t tokens, std::int64_t heads, bool causal,
                                           float softcap = 0.0f, double dropout = 0.0, std::int64_t fused_tile = 0);
// Rotary position embeddings on [q | k | v] rows (numerics_attention.hpp), and
// their table: cos and sin of theta = i base^(-2c/head_dim), [2][tokens][head_dim / 2].
std::unique_ptr<Layer> make_rotary(std::string name, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                                   double base = 10000.0);
std::vector<float> rotary_table(std::int64_t tokens, std::int64_t head_dim, double base);
// Dropout of probability p in training (identity in evaluation), its mask
// drawn per (seed, layer, step) from StepContext::stream (numerics_layers.hpp).
std::unique_ptr<Layer> make_dropout(std::string name, double p);
// The mask of a stream for probability p in [0, 1).
DropoutMask dropout_mask(const StochasticStream& stream, double p);
// y = cap tanh(x / cap), element by element (the model's logits, Gemma 2).
std::unique_ptr<Layer> make_soft_cap(std::string name, float cap);
// QK-LayerNorm on [q | k | v] rows: each head's q and k normalised over head_dim (numerics_attention.hpp).
std::unique_ptr<Layer> make_qk_norm(std::string name, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                                    float eps = 1e-5f, bool zero_centered = false);
// The mean over each sample's tokens.
std::unique_ptr<Layer> make_sequence_mean(std::string name, std::int64_t tokens);

// Fills every parameter's `initial` values: fan-in/fan-out from the shape
// ([out, in] or [out, in, k, k]); biases and LayerNorm beta zero, gamma
// norm_gamma (one; zero for a zero-centred gamma).
void initialize(std::vector<Parameter*> parameters, InitScheme scheme, double scale, std::uint64_t seed,
                float norm_gamma = 1.0f);

}  // namespace mpsim::core
