#pragma once
// A Backend that passes every call to another one: tests derive from it and
// override the calls they want to watch (what the trainer asks of a backend,
// with which streams and histories), leaving the arithmetic to the inner one.

#include <memory>
#include <utility>

#include "mpsim/core/backend.hpp"
#include "support/backend_internals.hpp"

namespace mpsim::test {

class ForwardingBackend : public core::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<core::Backend> inner) : inner_(std::move(inner)) {}
  core::Backend& inner() { return *inner_; }

  std::string_view name() const override { return inner_->name(); }
  core::Device device() const override { return inner_->device(); }
  bool supports(core::Op op) const override { return inner_->supports(op); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  void set_cpu_gemm(core::CpuGemm gemm) override { inner_->set_cpu_gemm(gemm); }
  void set_device_attention(core::DeviceAttention attention) override { inner_->set_device_attention(attention); }
  std::string describe_gemm(core::CpuGemm gemm, core::DeviceAttention attention) const override {
    return inner_->describe_gemm(gemm, attention);
  }
  core::Tensor zeros_impl(const core::Shape& shape) override { return inner_->zeros(shape); }
  core::Tensor empty_impl(const core::Shape& shape) override { return inner_->empty(shape); }
  core::Tensor from_host_impl(std::span<const float> values, const core::Shape& shape) override {
    return inner_->from_host(values, shape);
  }
  void to_host_impl(const core::Tensor& t, std::span<float> out) override { inner_->to_host(t, out); }
  void copy_impl(const core::Tensor& from, core::Tensor& to) override { inner_->copy(from, to); }
  core::RoundResult round_impl(core::Tensor& t, const core::RoundingPoint& point, float scale, StochasticStream stream,
                          core::TensorStats* stats) override {
    return inner_->round(t, point, scale, stream, stats);
  }
  void gemm_impl(const core::Tensor& a, bool ta, const core::Tensor& b, bool tb, core::Tensor& c,
            const core::GemmNumerics& numerics, StochasticStream stream) override {
    inner_->gemm(a, ta, b, tb, c, numerics, stream);
  }
  void add_row_vector_impl(core::Tensor& x, const core::Tensor& row) override { inner_->add_row_vector(x, row); }
  void column_sums_impl(const core::Tensor& x, core::Tensor& sums) override { inner_->column_sums(x, sums); }
  void scale_impl(core::Tensor& x, float factor) override { inner_->scale(x, factor); }
  double sum_squares_impl(const core::Tensor& x) override { return inner_->sum_squares(x); }
  float max_abs_finite_impl(const core::Tensor& x) override { return inner_->max_abs_finite(x); }
  void pointwise_forward_impl(const core::PointwiseCall& op, const core::Tensor& x, core::Tensor& y) override {
    inner_->pointwise_forward(op, x, y);
  }
  void pointwise_backward_impl(const core::PointwiseCall& op, const core::Tensor& saved, const core::Tensor& dy,
                               core::Tensor& dx) override {
    inner_->pointwise_backward(op, saved, dy, dx);
  }  void row_forward_impl(const core::RowCall& op, const core::RowLayout& layout, const core::Tensor& x,
                        core::Tensor& y, const RowTensors& tensors) override {
    inner_->row_forward(op, layout, x, y, tensors);
  }
  void row_backward_impl(const core::RowCall& op, const core::RowLayout& layout, const core::Tensor& x,
                         const core::Tensor& dy, core::Tensor& dx, const RowTensors& tensors) override {
    inner_->row_backward(op, layout, x, dy, dx, tensors);
  }


  void im2col_impl(const core::Tensor& x, const core::ConvGeometry& g, core::Tensor& columns) override {
    inner_->im2col(x, g, columns);
  }
  void col2im_impl(const core::Tensor& columns, const core::ConvGeometry& g, core::Tensor& dx) override {
    inner_->col2im(columns, g, dx);
  }
  void rows_to_nchw_impl(const core::Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w,
                    core::Tensor& nchw) override {
    inner_->rows_to_nchw(rows, batch, h, w, nchw);
  }
  void nchw_to_rows_impl(const core::Tensor& nchw, core::Tensor& rows) override { inner_->nchw_to_rows(nchw, rows); }
  void max_pool_forward_impl(const core::Tensor& x, const core::ConvGeometry& g, core::Tensor& y,
                        core::Tensor& argmax) override {
    inner_->max_pool_forward(x, g, y, argmax);
  }
  void max_pool_backward_impl(const core::Tensor& dy, const core::Tensor& argmax, core::Tensor& dx) override {
    inner_->max_pool_backward(dy, argmax, dx);
  }
  void add_impl(core::Tensor& x, const core::Tensor& y) override { inner_->add(x, y); }
  void attention_scores_impl(const core::Tensor& qkv, const core::AttentionShape& s, core::Tensor& scores) override {
    inner_->attention_scores(qkv, s, scores);
  }
  void attention_values_impl(const core::Tensor& probs, const core::Tensor& qkv, const core::AttentionShape& s,
                             core::Tensor& out) override {
    inner_->attention_values(probs, qkv, s, out);
  }
  void attention_values_backward_impl(const core::Tensor& probs, const core::Tensor& qkv, const core::Tensor& dout,
                                      const core::AttentionShape& s, core::Tensor& dprobs,
                                      core::Tensor& dqkv) override {
    inner_->attention_values_backward(probs, qkv, dout, s, dprobs, dqkv);
  }
  void attention_scores_backward_impl(const core::Tensor& dscores, const core::Tensor& qkv,
                                      const core::AttentionShape& s, core::Tensor& dqkv) override {
    inner_->attention_scores_backward(dscores, qkv, s, dqkv);
  }
  void fused_attention_forward_impl(const core::Tensor& qkv, const core::AttentionShape& s,
                                    const core::FusedAttention& fused, core::Tensor& out, core::Tensor& lse,
                                    core::Tensor& logit_max) override {
    inner_->fused_attention_forward(qkv, s, fused, out, lse, logit_max);
  }
  void fused_attention_probs_impl(const core::Tensor& scores, const core::Tensor& lse, core::Tensor& probs) override {
    inner_->fused_attention_probs(scores, lse, probs);
  }
  void fused_attention_row_dot_impl(const core::Tensor& dout, const core::Tensor& out, const core::AttentionShape& s,
                                    core::Tensor& dot) override {
    inner_->fused_attention_row_dot(dout, out, s, dot);
  }
  void fused_attention_scores_grad_impl(const core::Tensor& probs, const core::Tensor& dprobs,
                                        const core::Tensor& dot, core::Tensor& dscores) override {
    inner_->fused_attention_scores_grad(probs, dprobs, dot, dscores);
  }

  void gated_activation_forward_impl(core::Activation kind, const core::Tensor& x, core::Tensor& y) override {
    inner_->gated_activation_forward(kind, x, y);
  }
  void gated_activation_backward_impl(core::Activation kind, const core::Tensor& x, const core::Tensor& dy,
                                      core::Tensor& dx) override {
    inner_->gated_activation_backward(kind, x, dy, dx);
  }

  void softmax_forward_impl(const core::Tensor& x, core::Tensor& probs, const core::InternalRounding& low) override {
    inner_->softmax_forward(x, probs, low);
  }
  void softmax_backward_impl(const core::Tensor& probs, const core::Tensor& dprobs, core::Tensor& dx,
                             const core::InternalRounding& low) override {
    inner_->softmax_backward(probs, dprobs, dx, low);
  }
  void rotary_impl(const core::Tensor& qkv, const core::Tensor& table, const core::AttentionShape& shape,
                   bool inverse, core::Tensor& y) override {
    inner_->rotary(qkv, table, shape, inverse, y);
  }
  void sequence_mean_forward_impl(const core::Tensor& x, std::int64_t tokens, core::Tensor& y) override {
    inner_->sequence_mean_forward(x, tokens, y);
  }
  void sequence_mean_backward_impl(const core::Tensor& dy, std::int64_t tokens, core::Tensor& dx) override {
    inner_->sequence_mean_backward(dy, tokens, dx);
  }
  void embedding_forward_impl(const core::Tensor& ids, const core::Tensor& table, core::Tensor& out) override {
    inner_->embedding_forward(ids, table, out);
  }
  void embedding_backward_impl(const core::Tensor& ids, const core::Tensor& dout, core::Tensor& dtable) override {
    inner_->embedding_backward(ids, dout, dtable);
  }
  core::LossResult softmax_cross_entropy_impl(const core::Tensor& logits, const core::Tensor& labels, float grad_scale,
                                         core::Tensor& d_logits) override {
    return inner_->softmax_cross_entropy(logits, labels, grad_scale, d_logits);
  }
  void sgd_update(const core::Tensor& weight, const core::Tensor& grad, core::Tensor& momentum, float lr,
                  float momentum_factor, float weight_decay, bool first_step, core::Tensor& update) override {
    core::BackendInternals::sgd_update(*inner_, weight, grad, momentum, lr, momentum_factor, weight_decay, first_step,
                                       update);
  }
  void adam_update(const core::Tensor& weight, const core::Tensor& grad, core::Tensor& m, core::Tensor& v,
                   const core::AdamParams& p, core::Tensor& update) override {
    core::BackendInternals::adam_update(*inner_, weight, grad, m, v, p, update);
  }
  void apply_update(core::Tensor& weight, const core::Tensor& update, const core::RoundingPoint& storage,
                    StochasticStream stream, core::TensorStats* stats) override {
    core::BackendInternals::apply_update(*inner_, weight, update, storage, stream, stats);
  }
  void round_delayed_impl(core::Tensor& t, const core::RoundingPoint& point, core::Tensor& history, int margin,
                     bool record, StochasticStream stream, core::TensorStats* stats) override {
    inner_->round_delayed(t, point, history, margin, record, stream, stats);
  }
  void start_steps_impl(const core::LossScaling& scaling, const core::LossDefinition& loss,
                        const core::InternalRounding& loss_low) override {
    inner_->start_steps(scaling, loss, loss_low);
  }
  void step_loss_impl(const core::Tensor& logits, const core::Tensor& labels, core::Tensor& d_logits) override {
    inner_->step_loss(logits, labels, d_logits);
  }
  void step_check_gradient_impl(const core::Tensor& grad) override { inner_->step_check_gradient(grad); }
  void end_step_impl() override { inner_->end_step(); }
  void optimizer_step_impl(const core::OptimizerParams& params, core::Tensor& weight, core::Tensor& grad,
                      core::Tensor& state1, core::Tensor& state2, core::Tensor& update,
                      const core::RoundingPoint& storage, StochasticStream stream, core::TensorStats* stats) override {
    inner_->optimizer_step(params, weight, grad, state1, state2, update, storage, stream, stats);
  }
  void round_state_impl(core::Tensor& state, const core::RoundingPoint& point, core::Tensor* history, int margin,
                   StochasticStream stream) override {
    inner_->round_state(state, point, history, margin, stream);
  }
  std::vector<core::StepScalars> take_steps_impl() override { return inner_->take_steps(); }

 private:
  std::unique_ptr<core::Backend> inner_;
};

}  // namespace mpsim::test
