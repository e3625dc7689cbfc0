// The layers a transformer adds to layers.cpp's (Vaswani et al. 2017;
// Dosovitskiy et al., "An Image Is Worth 16x16 Words", ICLR 2021, for the
// ViT's patches, position embeddings and pooling). Same conventions: a
// layer's forward output is counted as its `activations`, the gradient it
// returns as its `activation_grads`, and a layer that passes values through
// unchanged counts nothing, so no tensor is counted twice.
//
// A residual connection x + f(x) is two layers around f that share the skip
// (make_residual): the model stays a sequence, and every layer of f keeps
// its own name, statistics and rounding sites.

#include <cmath>
#include <stdexcept>
#include <string>

#include "layer_operand.hpp"
#include "mpsim/core/model.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim::core {
namespace {

using detail::operand;

// The attention shape of [q | k | v] rows of a layer with a fixed head size
// (QK-LayerNorm, rotary embeddings); a clear error naming the layer otherwise.
AttentionShape qkv_shape(const std::string& layer, const Tensor& x, std::int64_t tokens, std::int64_t heads,
                         std::int64_t head_dim) {
  if (x.shape().size() != 2 || x.cols() != 3 * heads * head_dim || x.rows() % tokens != 0)
    throw std::invalid_argument(layer + ": expects [q | k | v] rows of 3 x " + std::to_string(heads) + " x " +
                                std::to_string(head_dim) + " values, " + std::to_string(tokens) + " rows per sample");
  AttentionShape s;
  s.batch = x.rows() / tokens;
  s.tokens = tokens;
  s.heads = heads;
  s.head_dim = head_dim;
  return s;
}

// The residual stream's rounding: binary32 when fp32_ops lists "residual".
RoundingPoint residual_point(const Policy& p) { return p.runs_in_fp32("residual") ? RoundingPoint{} : p.elementwise; }

// NCHW feature maps -> one row per position ([batch * h * w, channels]): a
// patch embedding's convolution output as tokens. Values pass through.
class Tokens final : public Layer {
 public:
  using Layer::Layer;
  Shape output_shape(const Shape& in) const override { return {in[0] * in[2] * in[3], in[1]}; }
  std::optional<RoundingPoint> output_rounding(const Policy&, const std::optional<RoundingPoint>& in) const override {
    return in;
  }
  std::optional<RoundingPoint> input_grad_rounding(const Policy&,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return grad;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    if (x.shape().size() != 4) throw std::invalid_argument(name() + ": expects NCHW input");
    input_shape_ = x.shape();
    Tensor rows = ctx.backend.empty(output_shape(x.shape()));
    ctx.backend.nchw_to_rows(x, rows);
    return rows;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    if (!need_input_grad) return {};
    Tensor dx = ctx.backend.empty(input_shape_);
    ctx.backend.rows_to_nchw(dy, input_shape_[0], input_shape_[2], input_shape_[3], dx);
    return dx;
  }

 private:
  Shape input_shape_;
};

// Token ids (any shape, binary32) -> a row of the table per id: a language
// model's first layer. Its output is the working weights' values, already
// rounded as weights: counted as activations, not rounded again.
class Embedding final : public Layer {
 public:
  Embedding(std::string name, std::int64_t vocabulary, std::int64_t width, std::shared_ptr<TiedTable> tie)
      : Layer(std::move(name)), width_(width), tie_(std::move(tie)) {
    table_.name = this->name() + ".weight";
    table_.shape = {vocabulary, width};
    if (tie_) tie_->table = &table_;
  }
  Shape output_shape(const Shape& in) const override { return {element_count(in), width_}; }
  std::vector<Parameter*> parameters() override { return {&table_}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.weights;
  }
  Tensor forward(StepContext& ctx, const Tensor& ids) override {
    ids_ = ids.reshaped({ids.numel()});
    Tensor y = ctx.backend.empty(output_shape(ids.shape()));
    ctx.backend.embedding_forward(ids_, table_.working, y);
    ctx.round(y, RoundingPoint{}, TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    if (need_input_grad) throw std::invalid_argument(name() + ": token ids have no gradient; put it first");
    ctx.backend.embedding_backward(ids_, dy, table_.grad);
    if (tie_ && !tie_->head_grad.empty()) {  // the tied head's part, rounded at its own site already
      ctx.backend.add(table_.grad, tie_->head_grad);
      tie_->head_grad = Tensor();
    }
    ctx.round(table_.grad, ctx.policy.weight_grads, TensorKind::weight_grads, Site::weight_grad);
    ids_ = Tensor();
    return {};
  }

 private:
  std::int64_t width_;
  std::shared_ptr<TiedTable> tie_;  // a tied head reads table_ and leaves its gradient here
  Parameter table_;
  Tensor ids_;
};

// x + E, E a learned [tokens, width] table added to every sample's rows:
// the start of the residual stream.
class PositionEmbedding final : public Layer {
 public:
  PositionEmbedding(std::string name, std::int64_t tokens, std::int64_t width)
      : Layer(std::move(name)), tokens_(tokens), width_(width) {
    table_.name = this->name() + ".weight";
    table_.shape = {tokens, width};
  }
  Shape output_shape(const Shape& in) const override { return in; }
  std::vector<Parameter*> parameters() override { return {&table_}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return residual_point(p);
  }
  std::optional<RoundingPoint> input_grad_rounding(const Policy&,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return grad;  // dx = dy
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    if (x.cols() != width_ || x.rows() % tokens_ != 0)
      throw std::invalid_argument(name() + ": expects rows of " + std::to_string(width_) + " values, " +
                                  std::to_string(tokens_) + " rows per sample");
    Tensor y = ctx.backend.empty(x.shape());
    ctx.backend.copy(x, y);
    Tensor rows = samples(y);
    ctx.backend.add_row_vector(rows, table_.working.reshaped({tokens_ * width_}));
    ctx.round(y, residual_point(ctx.policy), TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor grad = table_.grad.reshaped({tokens_ * width_});
    ctx.backend.column_sums(samples(dy), grad);
    ctx.round(table_.grad, ctx.policy.weight_grads, TensorKind::weight_grads, Site::weight_grad);
    return need_input_grad ? dy : Tensor();
  }

 private:
  Tensor samples(const Tensor& t) const { return t.reshaped({t.rows() / tokens_, tokens_ * width_}); }
  std::int64_t tokens_, width_;
  Parameter table_;
};

// The two ends of a residual connection y = x + f(x).
struct ResidualState {
  Tensor skip;  // x, from the forward pass
  Tensor grad;  // dy, from the backward pass
};

// Before f: keeps x for the sum; in backward, adds dy (the skip's gradient) to f's input gradient.
class ResidualBranch final : public Layer {
 public:
  ResidualBranch(std::string name, std::shared_ptr<ResidualState> state)
      : Layer(std::move(name)), state_(std::move(state)) {}
  Shape output_shape(const Shape& in) const override { return in; }
  std::optional<RoundingPoint> output_rounding(const Policy&, const std::optional<RoundingPoint>& in) const override {
    return in;
  }
  Tensor forward(StepContext&, const Tensor& x) override {
    state_->skip = x;
    return x;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor dx;
    if (need_input_grad) {
      dx = ctx.backend.empty(dy.shape());
      ctx.backend.copy(dy, dx);
      ctx.backend.add(dx, state_->grad);
      ctx.round(dx, ctx.policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
    }
    state_->grad = Tensor();
    return dx;
  }

 private:
  std::shared_ptr<ResidualState> state_;
};

// After f: y = f(x) + x, rounded as the residual stream; dy goes on to f and to the skip unchanged.
class ResidualAdd final : public Layer {
 public:
  ResidualAdd(std::string name, std::shared_ptr<ResidualState> state)
      : Layer(std::move(name)), state_(std::move(state)) {}
  Shape output_shape(const Shape& in) const override { return in; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return residual_point(p);
  }
  std::optional<RoundingPoint> input_grad_rounding(const Policy&,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return grad;
  }
  Tensor forward(StepContext& ctx, const Tensor& fx) override {
    if (state_->skip.shape() != fx.shape())
      throw std::invalid_argument(name() + ": the branch changed the shape of the residual stream");
    Tensor y = ctx.backend.empty(fx.shape());
    ctx.backend.copy(fx, y);
    ctx.backend.add(y, state_->skip);
    state_->skip = Tensor();
    ctx.round(y, residual_point(ctx.policy), TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext&, const Tensor& dy, bool) override {
    state_->grad = dy;
    return dy;
  }

 private:
  std::shared_ptr<ResidualState> state_;
};

// Multi-head self-attention on one Linear's [q | k | v] rows (the Linear and
// the output projection are layers of their own). Rounding, as autocast
// does it: q, k, v as GEMM operands (activations); the logits as a GEMM's
// output (gemm_output); softmax in binary32 when fp32_ops lists "softmax",
// else its arithmetic as softmax_internals says and its probabilities
// rounded as elementwise, then as the second GEMM's
// operand; the output as a GEMM's output. Backward: the output gradient as
// an operand, the probabilities' gradient as a GEMM's result
// (activation_grads), the logits' gradient as an operand, dqkv as
// activation_grads. With a fused tile (model.fused_attention), FlashAttention-2's
// path instead: fused_forward and fused_backward below.
class SelfAttention final : public Layer {
 public:
  SelfAttention(std::string name, std::int64_t tokens, std::int64_t heads, bool causal, float softcap,
                double dropout, std::int64_t fused_tile)
      : Layer(std::move(name)), tokens_(tokens), heads_(heads), causal_(causal), softcap_(softcap),
        dropout_(dropout), fused_tile_(fused_tile) {}
  Shape output_shape(const Shape& in) const override { return {in[0], in[1] / 3}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.gemm_output;
  }

  Tensor forward(StepContext& ctx, const Tensor& x) override {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    shape_ = shape_of(x);
    qkv_ = operand(ctx, x, p.activations, Site::input_operand);
    dropping_ = ctx.training && dropout_ > 0.0;
    if (dropping_) mask_ = dropout_mask(ctx.stream(Site::attention_dropout_mask), dropout_);
    if (fused_tile_ > 0) return fused_forward(ctx);
    Tensor scores = b.empty({shape_.score_rows(), tokens_});
    b.attention_scores(qkv_, shape_, scores);
    ctx.note_logit_max(scores);
    ctx.round(scores, logits_point(p), counted(ctx, TensorKind::attention_logits), Site::attention_scores);
    if (softcap_ > 0.0f) {  // in binary32 on the rounded logits, as the softmax kernel's prologue
      capped_ = b.empty(scores.shape());
      b.soft_cap_forward(scores, softcap_, true, capped_);
      scores = capped_;
    }
    probs_ = b.empty(scores.shape());
    b.softmax_forward(scores, probs_, internals(p));
    ctx.round(probs_, softmax_point(p), counted(ctx, TensorKind::attention_probs), Site::attention_probs);
    Tensor kept = probs_;
    if (dropping_) {  // on the probabilities, as the second product reads them (PyTorch's attn_dropout)
      kept = b.empty(probs_.shape());
      b.dropout(probs_, mask_, kept);
      ctx.round(kept, softmax_point(p), std::nullopt, Site::attention_probs_dropped);
    }
    probs_operand_ = operand(ctx, kept, p.activations, softmax_point(p), Site::attention_probs_operand);
    Tensor y = b.empty({shape_.rows(), shape_.width()});
    b.attention_values(probs_operand_, qkv_, shape_, y);
    ctx.round(y, p.gemm_output, TensorKind::activations, Site::output);
    return y;
  }

  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    Tensor dqkv;
    if (need_input_grad && fused_tile_ > 0) {
      dqkv = fused_backward(ctx, dy);
    } else if (need_input_grad) {
      const Tensor dout = operand(ctx, dy, p.gradient_operands, Site::output_grad_operand);
      Tensor dprobs = b.empty(probs_.shape());
      dqkv = b.empty(qkv_.shape());
      b.attention_values_backward(probs_operand_, qkv_, dout, shape_, dprobs, dqkv);
      // The product's output rounds, then (with dropout) the masked gradient of the probabilities, as
      // autocast rounds dkept and then dkept * mask * scale.
      ctx.round(dprobs, p.activation_grads, std::nullopt, Site::attention_probs_grad);
      if (dropping_) {
        b.dropout(dprobs, mask_, dprobs);
        ctx.round(dprobs, p.activation_grads, std::nullopt, Site::attention_probs_dropped_grad);
      }
      Tensor dscores = b.empty(probs_.shape());
      b.softmax_backward(probs_, dprobs, dscores, internals(p));
      if (softcap_ > 0.0f) b.soft_cap_backward(capped_, dscores, softcap_, dscores);
      ctx.round(dscores, p.gradient_operands, std::nullopt, Site::attention_scores_grad);
      b.attention_scores_backward(dscores, qkv_, shape_, dqkv);
      ctx.round(dqkv, p.activation_grads, TensorKind::activation_grads, Site::input_grad);
    }
    qkv_ = probs_ = probs_operand_ = capped_ = output_ = lse_ = Tensor();
    return dqkv;
  }

 private:
  // The fused path (numerics_attention.hpp's FusedAttention): q, k, v round
  // as operands as above; exp(s - m') rounds inside the kernel as the second
  // product's operand (policy.activations, unscaled and deterministic:
  // check_fused_attention refuses the rest before a run); the output rounds
  // as a GEMM's output. Logits and probabilities are never stored: the
  // logged logit maximum comes from the kernel's rows.
  Tensor fused_forward(StepContext& ctx) {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    const FusedAttention fused{fused_tile_, softcap_, fused_operand(p, &Policy::activations), dropping_, mask_};
    Tensor y = b.empty({shape_.rows(), shape_.width()});
    lse_ = b.empty({shape_.score_rows(), 1});
    Tensor logit_max = b.empty({shape_.score_rows(), 1});
    b.fused_attention_forward(qkv_, shape_, fused, y, lse_, logit_max);
    ctx.note_logit_max(logit_max);
    ctx.round(y, p.gemm_output, TensorKind::activations, Site::output);
    output_ = y;  // the stored O that the backward's D reads, as FlashAttention-2 keeps it (layers never write their input)
    return y;
  }
  // FlashAttention-2's backward: the logits recomputed in binary32, p from
  // the stored lse, p (with dropout: dropout(p)) rounded as dV's operand,
  // dp = dout v^T in binary32 (with dropout: masked likewise), ds = p (dp - D)
  // rounded as the operand of dQ's and dK's products.
  Tensor fused_backward(StepContext& ctx, const Tensor& dy) {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    const Tensor dout = operand(ctx, dy, p.gradient_operands, Site::output_grad_operand);
    Tensor scores = b.empty({shape_.score_rows(), tokens_});
    b.attention_scores(qkv_, shape_, scores);
    if (softcap_ > 0.0f) {
      capped_ = b.empty(scores.shape());
      b.soft_cap_forward(scores, softcap_, true, capped_);
      scores = capped_;
    }
    Tensor probs = b.empty(scores.shape());
    b.fused_attention_probs(scores, lse_, probs);
    Tensor kept = probs;
    if (dropping_) {  // the forward's mask: dV's operand is dropout(p), and dp is masked the same way
      kept = b.empty(probs.shape());
      b.dropout(probs, mask_, kept);
    }
    const Tensor probs_operand = operand(ctx, kept, p.activations, std::nullopt, Site::attention_probs_operand);
    Tensor dprobs = b.empty(probs.shape()), dqkv = b.empty(qkv_.shape());
    b.attention_values_backward(probs_operand, qkv_, dout, shape_, dprobs, dqkv);
    if (dropping_) b.dropout(dprobs, mask_, dprobs);
    Tensor dot = b.empty({shape_.score_rows(), 1});
    b.fused_attention_row_dot(dout, output_, shape_, dot);
    Tensor dscores = dprobs;  // element by element, in place
    b.fused_attention_scores_grad(probs, dprobs, dot, dscores);
    if (softcap_ > 0.0f) b.soft_cap_backward(capped_, dscores, softcap_, dscores);
    ctx.round(dscores, p.gradient_operands, std::nullopt, Site::attention_scores_grad);
    b.attention_scores_backward(dscores, qkv_, shape_, dqkv);
    ctx.round(dqkv, p.activation_grads, TensorKind::activation_grads, Site::input_grad);
    return dqkv;
  }
  static InternalRounding fused_operand(const Policy& p, const RoundingPoint Policy::*point) {
    return internal_rounding(p, point, "fused attention");
  }
  // The logits and probabilities are counted when the run asks (TrainSpec::attention_stats).
  static std::optional<TensorKind> counted(const StepContext& ctx, TensorKind kind) {
    return ctx.attention_stats ? std::optional<TensorKind>(kind) : std::nullopt;
  }
  // The logits round as a GEMM's output unless the policy keeps them in binary32 (fp32_ops
  // "attention_logits"; the fused path never rounds them).
  static RoundingPoint logits_point(const Policy& p) {
    return p.runs_in_fp32("attention_logits") ? RoundingPoint{} : p.gemm_output;
  }
  static RoundingPoint softmax_point(const Policy& p) {
    return p.runs_in_fp32("softmax") ? RoundingPoint{} : p.elementwise;
  }
  static InternalRounding internals(const Policy& p) {
    return internal_rounding(p, &Policy::softmax_internals, "softmax");
  }
  AttentionShape shape_of(const Tensor& x) const {
    if (x.shape().size() != 2 || x.cols() % (3 * heads_) != 0 || x.rows() % tokens_ != 0)
      throw std::invalid_argument(name() + ": expects [q | k | v] rows of 3 x heads x head_dim values, " +
                                  std::to_string(tokens_) + " rows per sample");
    AttentionShape s;
    s.batch = x.rows() / tokens_;
    s.tokens = tokens_;
    s.heads = heads_;
    s.head_dim = x.cols() / (3 * heads_);
    s.causal = causal_;
    return s;
  }
  std::int64_t tokens_, heads_;
  bool causal_;
  float softcap_;  // > 0: the logits soft-capped at +-softcap before the softmax
  double dropout_;  // > 0: dropout on the probabilities in training
  std::int64_t fused_tile_;  // > 0: the fused path with tiles of this many keys
  bool dropping_ = false;
  DropoutMask mask_;
  AttentionShape shape_;
  Tensor qkv_, probs_, probs_operand_, capped_;
  Tensor output_, lse_;  // the fused path's
};

// Rotary position embeddings on the qkv Linear's [q | k | v] rows
// (numerics_attention.hpp's rotary_value), in place of a learned position
// table: q and k turned by their positions' angles, v unchanged; the output
// rounds at `elementwise`, the input gradient (the inverse rotation of dy) at
// `activation_grads`. No parameters.
class Rotary final : public Layer {
 public:
  Rotary(std::string name, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, double base)
      : Layer(std::move(name)), tokens_(tokens), heads_(heads), head_dim_(head_dim),
        host_table_(rotary_table(tokens, head_dim, base)) {}
  Shape output_shape(const Shape& in) const override { return in; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.elementwise;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    shape_ = shape_of(x);
    if (table_.empty()) table_ = ctx.backend.from_host(host_table_, {static_cast<std::int64_t>(host_table_.size())});
    Tensor y = ctx.backend.empty(x.shape());
    ctx.backend.rotary(x, table_, shape_, false, y);
    ctx.round(y, ctx.policy.elementwise, TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    if (!need_input_grad) return {};
    Tensor dx = ctx.backend.empty(dy.shape());
    ctx.backend.rotary(dy, table_, shape_, true, dx);
    ctx.round(dx, ctx.policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
    return dx;
  }

 private:
  AttentionShape shape_of(const Tensor& x) const { return qkv_shape(name(), x, tokens_, heads_, head_dim_); }
  std::int64_t tokens_, heads_, head_dim_;
  std::vector<float> host_table_;
  Tensor table_;  // on the backend, uploaded at the first forward pass
  AttentionShape shape_;
};

// The mean over each sample's tokens: [batch * tokens, width] -> [batch, width].
class SequenceMean final : public Layer {
 public:
  SequenceMean(std::string name, std::int64_t tokens) : Layer(std::move(name)), tokens_(tokens) {}
  Shape output_shape(const Shape& in) const override { return {in[0] / tokens_, in[1]}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.elementwise;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    input_shape_ = x.shape();
    Tensor y = ctx.backend.empty(output_shape(x.shape()));
    ctx.backend.sequence_mean_forward(x, tokens_, y);
    ctx.round(y, ctx.policy.elementwise, TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    if (!need_input_grad) return {};
    Tensor dx = ctx.backend.empty(input_shape_);
    ctx.backend.sequence_mean_backward(dy, tokens_, dx);
    ctx.round(dx, ctx.policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
    return dx;
  }

 private:
  std::int64_t tokens_;
  Shape input_shape_;
};

}  // namespace

std::unique_ptr<Layer> make_embedding(std::string name, std::int64_t vocabulary, std::int64_t width,
                                      std::shared_ptr<TiedTable> tie) {
  return std::make_unique<Embedding>(std::move(name), vocabulary, width, std::move(tie));
}
std::unique_ptr<Layer> make_tokens(std::string name) { return std::make_unique<Tokens>(std::move(name)); }
std::unique_ptr<Layer> make_position_embedding(std::string name, std::int64_t tokens, std::int64_t width) {
  return std::make_unique<PositionEmbedding>(std::move(name), tokens, width);
}
ResidualLayers make_residual(const std::string& branch_name, const std::string& add_name) {
  auto state = std::make_shared<ResidualState>();
  return {std::make_unique<ResidualBranch>(branch_name, state), std::make_unique<ResidualAdd>(add_name, state)};
}
std::unique_ptr<Layer> make_self_attention(std::string name, std::int64_t tokens, std::int64_t heads, bool causal,
                                           float softcap, double dropout, std::int64_t fused_tile) {
  return std::make_unique<SelfAttention>(std::move(name), tokens, heads, causal, softcap, dropout, fused_tile);
}
DropoutMask dropout_mask(const StochasticStream& stream, double p) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout probability " + std::to_string(p) + " is not in [0, 1)");
  DropoutMask m;
  m.key = make_draw_key(stream.key);
  m.first_index = stream.first_index;
  m.threshold = static_cast<std::uint32_t>(std::floor(p * 0x1p32));
  m.scale = static_cast<float>(1.0 / (1.0 - p));
  return m;
}
// Dropout in training (numerics_layers.hpp's dropout_value; identity in
// evaluation): its output rounds at `elementwise` (the scaling by 1 / (1 - p)
// leaves the format), its input gradient, the same mask on dy, at
// `activation_grads`.
std::unique_ptr<Layer> make_dropout(std::string name, double p) {
  const auto mask = [p](const StepContext& ctx) -> std::optional<PointwiseCall> {
    if (!ctx.training || !(p > 0.0)) return std::nullopt;
    return dropout_call(dropout_mask(ctx.stream(Site::dropout_mask), p));
  };
  return make_pointwise(std::move(name),
                        {.op = dropout_call({}), .output = PointwiseOutput::elementwise, .per_step = mask});
}
std::vector<float> rotary_table(std::int64_t tokens, std::int64_t head_dim, double base) {
  if (tokens < 1 || head_dim < 2 || head_dim % 2 != 0 || !(base > 1.0))
    throw std::invalid_argument("rotary_table: needs tokens >= 1, an even head_dim >= 2 and a base > 1 (got " +
                                std::to_string(tokens) + ", " + std::to_string(head_dim) + ", " +
                                std::to_string(base) + ")");
  const std::int64_t half = head_dim / 2;
  std::vector<float> table(static_cast<std::size_t>(2 * tokens * half));
  for (std::int64_t i = 0; i < tokens; ++i)
    for (std::int64_t c = 0; c < half; ++c) {
      // theta = i * base^(-2c/d) in binary64, its cos and sin rounded once to binary32.
      const double theta =
          static_cast<double>(i) * std::pow(base, -2.0 * static_cast<double>(c) / static_cast<double>(head_dim));
      table[static_cast<std::size_t>(i * half + c)] = static_cast<float>(std::cos(theta));
      table[static_cast<std::size_t>((tokens + i) * half + c)] = static_cast<float>(std::sin(theta));
    }
  return table;
}
std::unique_ptr<Layer> make_rotary(std::string name, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                                   double base) {
  return std::make_unique<Rotary>(std::move(name), tokens, heads, head_dim, base);
}
// Soft-capping of the model's logits (Gemma 2's final logit soft-capping):
// the head's rounded output capped in binary32, as the loss reads it (counted,
// not rounded); the gradient rounds at activation_grads. The logged
// output-logit maximum is the head's, before the cap (StepContext::output_layer
// is the head).
std::unique_ptr<Layer> make_soft_cap(std::string name, float cap) {
  return make_pointwise(std::move(name),
                        {.op = soft_cap_call(cap, false), .output = PointwiseOutput::binary32, .per_step = {}});
}
// QK-LayerNorm on the qkv Linear's [q | k | v] rows (numerics_attention.hpp):
// rounded as LayerNorm, its output in binary32 when fp32_ops lists
// "layer_norm" (v passes through that rounding too). Its gamma and beta are
// the layer's weight and bias: ones and zeros at first, no weight decay with
// optimizer.decay_vectors = false.
std::unique_ptr<Layer> make_qk_norm(std::string name, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                                    float eps, bool zero_centered) {
  RowLayerSpec spec{
      .call = [eps, zero_centered](const Policy& p) {
        return norm_call(eps, true, internal_rounding(p, &Policy::norm_statistics, "layer_norm"), zero_centered);
      },
      .layout = [name, tokens, heads, head_dim](const Tensor& x) {
        return RowLayout::qk_heads(qkv_shape(name, x, tokens, heads, head_dim));
      },
      .parameter_shape = {2 * head_dim},
      .bias = true};
  return make_row_layer(std::move(name), std::move(spec));
}
std::unique_ptr<Layer> make_sequence_mean(std::string name, std::int64_t tokens) {
  return std::make_unique<SequenceMean>(std::move(name), tokens);
}

}  // namespace mpsim::core
