// Layers: forward and explicit backward, each rounding where the policy says.
// Convention: a layer's forward output is counted as its `activations`, the
// gradient it returns (with respect to its input) as its `activation_grads`.

#include <cmath>
#include <stdexcept>

#include "layer_operand.hpp"
#include "mpsim/core/model.hpp"

namespace mpsim::core {
namespace {

Shape with_rows(std::int64_t rows, std::int64_t cols) { return {rows, cols}; }

using detail::operand;

// Rounds a selecting layer's input gradient (ReLU, max pooling) at activation_grads, and counts it, unless its
// values already passed a point that keeps them (selected_gradient_passes): then it is no tensor of its own.
void round_selected_gradient(StepContext& ctx, Tensor& dx, bool selects) {
  if (selects && selected_gradient_passes(ctx.policy, ctx.incoming)) return;
  ctx.round(dx, ctx.policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
}

class Linear final : public Layer {
 public:
  Linear(std::string name, std::int64_t in, std::int64_t out, std::shared_ptr<TiedTable> tie = nullptr)
      : Layer(std::move(name)), in_(in), out_(out), tie_(std::move(tie)) {
    weight_.name = this->name() + ".weight";
    weight_.shape = {out, in};
    bias_.name = this->name() + ".bias";
    bias_.shape = {out};
    if (tie_ && (!tie_->table || tie_->table->shape != weight_.shape))
      throw std::invalid_argument(this->name() + ": a tied weight must be an existing [" + std::to_string(out) + ", " +
                                  std::to_string(in) + "] table");
  }
  Shape output_shape(const Shape& input) const override { return with_rows(input[0], out_); }
  std::vector<Parameter*> parameters() override {
    return tie_ ? std::vector<Parameter*>{&bias_} : std::vector<Parameter*>{&weight_, &bias_};
  }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.gemm_output;
  }

  Tensor forward(StepContext& ctx, const Tensor& x) override {
    const Policy& p = ctx.policy;
    input_shape_ = x.shape();
    input_ = operand(ctx, x.reshaped(with_rows(x.rows(), in_)), p.activations, Site::input_operand);
    Tensor y = ctx.backend.empty(with_rows(x.rows(), out_));
    ctx.backend.gemm(input_, false, weight().working, true, y, ctx.gemm_numerics(GemmRole::fprop, p.activations, p.weights),
                     ctx.stream(Site::output_sum));
    ctx.backend.add_row_vector(y, bias_.working);
    ctx.note_output_logits(y);  // the model's logits, when this is its last layer, before they round
    ctx.round(y, p.gemm_output, TensorKind::activations, Site::output);
    return y;
  }

  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    const Tensor dyq = operand(ctx, dy, p.gradient_operands, Site::output_grad_operand);
    Tensor& weight_grad = tie_ ? (tie_->head_grad = b.empty(weight_.shape)) : weight_.grad;
    b.gemm(dyq, true, input_, false, weight_grad, ctx.gemm_numerics(GemmRole::wgrad, p.gradient_operands, p.activations),
           ctx.stream(Site::weight_grad_sum));
    ctx.round(weight_grad, p.weight_grads, TensorKind::weight_grads, Site::weight_grad);
    b.column_sums(dy, bias_.grad);
    ctx.round(bias_.grad, p.weight_grads, TensorKind::weight_grads, Site::bias_grad);
    Tensor dx;
    if (need_input_grad) {
      dx = b.empty(input_.shape());
      b.gemm(dyq, false, weight().working, false, dx, ctx.gemm_numerics(GemmRole::dgrad, p.gradient_operands, p.weights),
             ctx.stream(Site::input_grad_sum));
      ctx.round(dx, p.activation_grads, TensorKind::activation_grads, Site::input_grad);
      dx = dx.reshaped(input_shape_);
    }
    input_ = Tensor();
    return dx;
  }

 private:
  Parameter& weight() { return tie_ ? *tie_->table : weight_; }
  std::int64_t in_, out_;
  std::shared_ptr<TiedTable> tie_;  // null: the weight is weight_
  Parameter weight_, bias_;
  Tensor input_;
  Shape input_shape_;
};

class Conv2d final : public Layer {
 public:
  Conv2d(std::string name, std::int64_t cin, std::int64_t cout, std::int64_t kernel, std::int64_t stride,
         std::int64_t padding)
      : Layer(std::move(name)), cin_(cin), cout_(cout) {
    geometry_.channels = cin;
    geometry_.kernel = kernel;
    geometry_.stride = stride;
    geometry_.padding = padding;
    weight_.name = this->name() + ".weight";
    weight_.shape = {cout, cin, kernel, kernel};
    bias_.name = this->name() + ".bias";
    bias_.shape = {cout};
  }
  Shape output_shape(const Shape& in) const override {
    ConvGeometry g = geometry_;
    g.height = in[2];
    g.width = in[3];
    return {in[0], cout_, g.out_height(), g.out_width()};
  }
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.gemm_output;
  }

  Tensor forward(StepContext& ctx, const Tensor& x) override {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    if (x.shape().size() != 4 || x.shape()[1] != cin_) throw std::invalid_argument(name() + ": expects NCHW input");
    geometry_.batch = x.shape()[0];
    geometry_.height = x.shape()[2];
    geometry_.width = x.shape()[3];
    const Tensor xq = operand(ctx, x, p.activations, Site::input_operand);
    const std::int64_t patches = geometry_.batch * geometry_.out_height() * geometry_.out_width();
    columns_ = b.empty(with_rows(patches, cin_ * geometry_.kernel * geometry_.kernel));
    b.im2col(xq, geometry_, columns_);
    Tensor rows = b.empty(with_rows(patches, cout_));
    b.gemm(columns_, false, weight_.working.reshaped(with_rows(cout_, columns_.cols())), true, rows,
           ctx.gemm_numerics(GemmRole::fprop, p.activations, p.weights), ctx.stream(Site::output_sum));
    b.add_row_vector(rows, bias_.working);
    Tensor y = b.empty(output_shape(x.shape()));
    b.rows_to_nchw(rows, geometry_.batch, geometry_.out_height(), geometry_.out_width(), y);
    ctx.round(y, p.gemm_output, TensorKind::activations, Site::output);
    return y;
  }

  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    const Policy& p = ctx.policy;
    Backend& b = ctx.backend;
    const std::int64_t patches = columns_.rows();
    Tensor dy_rows = b.empty(with_rows(patches, cout_));
    b.nchw_to_rows(dy, dy_rows);
    b.column_sums(dy_rows, bias_.grad);
    ctx.round(bias_.grad, p.weight_grads, TensorKind::weight_grads, Site::bias_grad);
    const Tensor dyq = operand(ctx, dy_rows, p.gradient_operands, Site::output_grad_operand);
    Tensor dw = weight_.grad.reshaped(with_rows(cout_, columns_.cols()));
    b.gemm(dyq, true, columns_, false, dw, ctx.gemm_numerics(GemmRole::wgrad, p.gradient_operands, p.activations),
           ctx.stream(Site::weight_grad_sum));
    ctx.round(weight_.grad, p.weight_grads, TensorKind::weight_grads, Site::weight_grad);
    Tensor dx;
    if (need_input_grad) {
      Tensor dcols = b.empty(columns_.shape());
      b.gemm(dyq, false, weight_.working.reshaped(with_rows(cout_, columns_.cols())), false, dcols,
             ctx.gemm_numerics(GemmRole::dgrad, p.gradient_operands, p.weights), ctx.stream(Site::input_grad_sum));
      dx = b.zeros({geometry_.batch, cin_, geometry_.height, geometry_.width});
      b.col2im(dcols, geometry_, dx);  // overlapping patches add in binary32
      ctx.round(dx, p.activation_grads, TensorKind::activation_grads, Site::input_grad);
    }
    columns_ = Tensor();
    return dx;
  }

 private:
  std::int64_t cin_, cout_;
  ConvGeometry geometry_;
  Parameter weight_, bias_;
  Tensor columns_;
};

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(std::string name, std::int64_t kernel, std::int64_t stride) : Layer(std::move(name)) {
    geometry_.kernel = kernel;
    geometry_.stride = stride;
  }
  Shape output_shape(const Shape& in) const override {
    ConvGeometry g = geometry_;
    g.height = in[2];
    g.width = in[3];
    return {in[0], in[1], g.out_height(), g.out_width()};
  }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return p.elementwise;
  }
  // Windows that do not overlap give each input at most one output's gradient: dx selects from dy.
  bool selects() const { return geometry_.stride >= geometry_.kernel; }
  std::optional<RoundingPoint> input_grad_rounding(const Policy& p,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return selects() && selected_gradient_passes(p, grad) ? grad : p.activation_grads;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    geometry_.batch = x.shape()[0];
    geometry_.channels = x.shape()[1];
    geometry_.height = x.shape()[2];
    geometry_.width = x.shape()[3];
    input_shape_ = x.shape();
    Tensor y = ctx.backend.empty(output_shape(x.shape()));
    argmax_ = ctx.backend.empty(y.shape());
    ctx.backend.max_pool_forward(x, geometry_, y, argmax_);
    ctx.round(y, ctx.policy.elementwise, TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor dx;
    if (need_input_grad) {
      dx = ctx.backend.empty(input_shape_);
      ctx.backend.max_pool_backward(dy, argmax_, dx);
      round_selected_gradient(ctx, dx, selects());
    }
    argmax_ = Tensor();
    return dx;
  }

 private:
  ConvGeometry geometry_;
  Shape input_shape_;
  Tensor argmax_;
};

class Flatten final : public Layer {
 public:
  using Layer::Layer;
  Shape output_shape(const Shape& in) const override { return with_rows(in[0], element_count(in) / in[0]); }
  // A reshape: values pass through unchanged, in both directions.
  std::optional<RoundingPoint> output_rounding(const Policy&, const std::optional<RoundingPoint>& in) const override {
    return in;
  }
  std::optional<RoundingPoint> input_grad_rounding(const Policy&,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return grad;
  }
  Tensor forward(StepContext&, const Tensor& x) override {
    input_shape_ = x.shape();
    return x.reshaped(output_shape(x.shape()));
  }
  Tensor backward(StepContext&, const Tensor& dy, bool need_input_grad) override {
    return need_input_grad ? dy.reshaped(input_shape_) : Tensor();
  }

 private:
  Shape input_shape_;
};

// Any entry of the element-wise table (numerics_ops.hpp), rounded where
// PointwiseLayerSpec says (model.hpp). The input gradient rounds at
// activation_grads, unless the entry only selects values of dy and dy already
// passed a point that keeps them (round_selected_gradient).
class PointwiseLayer final : public Layer {
 public:
  PointwiseLayer(std::string name, PointwiseLayerSpec spec) : Layer(std::move(name)), spec_(std::move(spec)) {}
  Shape output_shape(const Shape& in) const override { return in; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    if (spec_.per_step) return std::nullopt;  // unknown: it may pass its input through
    return output_point(p);
  }
  bool selects() const { return Pointwises::selects_gradient[spec_.op.index()]; }
  std::optional<RoundingPoint> input_grad_rounding(const Policy& p,
                                                   const std::optional<RoundingPoint>& grad) const override {
    return selects() && selected_gradient_passes(p, grad) ? grad : p.activation_grads;
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    call_ = spec_.per_step ? spec_.per_step(ctx) : spec_.op;
    if (!call_) return x;
    Tensor y = ctx.backend.empty(x.shape());
    ctx.backend.pointwise_forward(*call_, x, y);
    ctx.round(y, output_point(ctx.policy), TensorKind::activations, Site::output);
    switch (pointwise_saves(*call_)) {
      case Saves::input: saved_ = x; break;
      case Saves::output: saved_ = y; break;
      case Saves::nothing: break;
    }
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor dx;
    if (need_input_grad && !call_) {
      dx = dy;
    } else if (need_input_grad) {
      dx = ctx.backend.empty(dy.shape());
      ctx.backend.pointwise_backward(*call_, saved_, dy, dx);
      round_selected_gradient(ctx, dx, selects());
    }
    saved_ = Tensor();
    return dx;
  }

 private:
  RoundingPoint output_point(const Policy& p) const {
    switch (spec_.output) {
      case PointwiseOutput::elementwise: return p.elementwise;
      case PointwiseOutput::binary32: return RoundingPoint{};
      case PointwiseOutput::autocast: {
        const std::size_t entry = spec_.op.index();
        return Pointwises::fp32_op[entry] && p.runs_in_fp32(Pointwises::names[entry]) ? RoundingPoint{}
                                                                                      : p.elementwise;
      }
    }
    return p.elementwise;
  }
  PointwiseLayerSpec spec_;
  std::optional<PointwiseCall> call_;  // this step's; none: the input passed through
  Tensor saved_;
};

// A gated linear unit (Shazeer 2020) on rows of [gate | value]:
// activation(gate) * value (SiLU: SwiGLU), rounded as autocast rounds the
// activation (binary32 when fp32_ops lists it and the table allows it).
class GatedActivation final : public Layer {
 public:
  GatedActivation(std::string name, Activation kind) : Layer(std::move(name)), kind_(kind) {}
  Shape output_shape(const Shape& in) const override { return Shape{in[0], in[1] / 2}; }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return output_point(p);
  }
  Tensor forward(StepContext& ctx, const Tensor& x) override {
    if (x.shape().size() != 2 || x.cols() % 2 != 0)
      throw std::invalid_argument(name() + ": expects rows of 2n values [gate | value]");
    input_ = x;
    Tensor y = ctx.backend.empty(output_shape(x.shape()));
    ctx.backend.gated_activation_forward(kind_, x, y);
    ctx.round(y, output_point(ctx.policy), TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Tensor dx;
    if (need_input_grad) {
      dx = ctx.backend.empty(input_.shape());
      ctx.backend.gated_activation_backward(kind_, input_, dy, dx);
      round_selected_gradient(ctx, dx, false);
    }
    input_ = Tensor();
    return dx;
  }

 private:
  RoundingPoint output_point(const Policy& p) const {
    return activation_is_fp32_op(kind_) && p.runs_in_fp32(to_string(kind_)) ? RoundingPoint{} : p.elementwise;
  }
  Activation kind_;
  Tensor input_;
};

// Any entry of the row-wise table (numerics_rows.hpp) with its parameters:
// LayerNorm, RMSNorm (Zhang and Sennrich 2019; LLaMA: no mean, no beta) and
// QK-LayerNorm. Rounded as autocast's layer_norm: the output in binary32 when
// fp32_ops lists the entry, else at `elementwise`.
class RowLayer final : public Layer {
 public:
  RowLayer(std::string name, RowLayerSpec spec) : Layer(std::move(name)), spec_(std::move(spec)) {
    weight_.name = this->name() + ".weight";
    weight_.shape = spec_.parameter_shape;
    bias_.name = this->name() + ".bias";
    bias_.shape = spec_.parameter_shape;
  }
  Shape output_shape(const Shape& in) const override { return in; }
  std::vector<Parameter*> parameters() override {
    return spec_.bias ? std::vector<Parameter*>{&weight_, &bias_} : std::vector<Parameter*>{&weight_};
  }
  std::optional<RoundingPoint> output_rounding(const Policy& p, const std::optional<RoundingPoint>&) const override {
    return output_point(spec_.call(p), p);
  }

  Tensor forward(StepContext& ctx, const Tensor& x) override {
    Backend& b = ctx.backend;
    input_ = x;
    layout_ = spec_.layout(x);
    const RowCall call = spec_.call(ctx.policy);
    Backend::RowTensors t;
    Rows::visit(call, [&]<typename R>(R, const typename R::Params& p) {
      for (int k = 0; k < 2; ++k) {
        statistics_[k] = R::needs_statistic(p, k) ? b.empty({layout_.segments}) : Tensor();
        if (R::needs_statistic(p, k)) t.statistics[k] = &statistics_[k];
        if (R::needs_parameter(p, k, false)) t.parameters[k] = &parameter(k).working;
      }
    });
    Tensor y = b.empty(x.shape());
    b.row_forward(call, layout_, x, y, t);
    ctx.round(y, output_point(call, ctx.policy), TensorKind::activations, Site::output);
    return y;
  }
  Tensor backward(StepContext& ctx, const Tensor& dy, bool need_input_grad) override {
    Backend& b = ctx.backend;
    const Policy& policy = ctx.policy;
    const RowCall call = spec_.call(policy);
    Backend::RowTensors t;
    Rows::visit(call, [&]<typename R>(R, const typename R::Params& p) {
      for (int k = 0; k < 2; ++k) {
        if (R::needs_statistic(p, k)) t.statistics[k] = &statistics_[k];
        if (R::needs_parameter(p, k, true)) t.parameters[k] = &parameter(k).working;
        if (R::needs_parameter_grad(p, k)) t.parameter_grads[k] = &parameter(k).grad;
      }
    });
    Tensor dx = b.empty(dy.shape());
    b.row_backward(call, layout_, input_, dy, dx, t);
    ctx.round(weight_.grad, policy.weight_grads, TensorKind::weight_grads, Site::weight_grad);
    if (spec_.bias) ctx.round(bias_.grad, policy.weight_grads, TensorKind::weight_grads, Site::bias_grad);
    if (need_input_grad) ctx.round(dx, policy.activation_grads, TensorKind::activation_grads, Site::input_grad);
    input_ = statistics_[0] = statistics_[1] = Tensor();
    return need_input_grad ? dx : Tensor();
  }

 private:
  Parameter& parameter(int k) { return k == 0 ? weight_ : bias_; }
  static RoundingPoint output_point(const RowCall& call, const Policy& p) {
    return p.runs_in_fp32(Rows::fp32_ops[call.index()]) ? RoundingPoint{} : p.elementwise;
  }
  RowLayerSpec spec_;
  Parameter weight_, bias_;
  RowLayout layout_;
  Tensor input_, statistics_[2];
};

}  // namespace

namespace {
RowLayerSpec norm_spec(std::int64_t features, float eps, bool centered, bool zero_centered) {
  return {.call = [eps, centered, zero_centered](const Policy& p) {
            return norm_call(eps, centered, internal_rounding(p, &Policy::norm_statistics, "layer_norm"),
                             zero_centered);
          },
          .layout = [features](const Tensor& x) { return RowLayout::rows(x.numel() / features, features); },
          .parameter_shape = {features},
          .bias = centered};
}
}  // namespace

std::unique_ptr<Layer> make_linear(std::string name, std::int64_t in, std::int64_t out) {
  return std::make_unique<Linear>(std::move(name), in, out);
}
std::unique_ptr<Layer> make_tied_linear(std::string name, std::int64_t in, std::int64_t out,
                                        std::shared_ptr<TiedTable> tie) {
  if (!tie) throw std::invalid_argument(name + ": a tied Linear needs the embedding's table");
  return std::make_unique<Linear>(std::move(name), in, out, std::move(tie));
}
std::unique_ptr<Layer> make_conv2d(std::string name, std::int64_t in_channels, std::int64_t out_channels,
                                   std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return std::make_unique<Conv2d>(std::move(name), in_channels, out_channels, kernel, stride, padding);
}
std::unique_ptr<Layer> make_max_pool2d(std::string name, std::int64_t kernel, std::int64_t stride) {
  return std::make_unique<MaxPool2d>(std::move(name), kernel, stride);
}
std::unique_ptr<Layer> make_flatten(std::string name) { return std::make_unique<Flatten>(std::move(name)); }
std::unique_ptr<Layer> make_pointwise(std::string name, PointwiseLayerSpec spec) {
  return std::make_unique<PointwiseLayer>(std::move(name), std::move(spec));
}
std::unique_ptr<Layer> make_activation(std::string name, Activation kind) {
  return make_pointwise(std::move(name),
                        {.op = activation_call(kind), .output = PointwiseOutput::autocast, .per_step = {}});
}
std::unique_ptr<Layer> make_gated_activation(std::string name, Activation kind) {
  return std::make_unique<GatedActivation>(std::move(name), kind);
}
std::unique_ptr<Layer> make_row_layer(std::string name, RowLayerSpec spec) {
  return std::make_unique<RowLayer>(std::move(name), std::move(spec));
}
// Over rows of `features` values, the statistics as policy.norm_statistics
// says (binary64 sums by default, as autocast's FP32 layer_norm).
std::unique_ptr<Layer> make_layer_norm(std::string name, std::int64_t features, float eps, bool zero_centered) {
  return make_row_layer(std::move(name), norm_spec(features, eps, true, zero_centered));
}
std::unique_ptr<Layer> make_rms_norm(std::string name, std::int64_t features, float eps, bool zero_centered) {
  return make_row_layer(std::move(name), norm_spec(features, eps, false, zero_centered));
}
std::unique_ptr<Layer> make_norm(std::string name, const ModelSpec& spec, std::int64_t features) {
  return make_row_layer(std::move(name),
                        norm_spec(features, 1e-5f, spec.norm == NormKind::layer_norm, spec.zero_centered_gamma));
}

}  // namespace mpsim::core
