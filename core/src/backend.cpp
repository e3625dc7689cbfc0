// Backend's public calls: each checks its tensors and asks supports() once,
// then runs the backend's implementation, which trusts its inputs.
#include "mpsim/core/backend.hpp"

#include <cmath>
#include <string>

namespace mpsim::core {
namespace {

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void Backend::require_support(Op op, std::string_view call) const {
  if (!supports(op))
    throw BackendError("backend \"" + std::string(name()) + "\" does not support " + std::string(to_string(op)) +
                       " (called as " + std::string(call) + "); run this arm on a backend that does");
}

void Backend::require_tensor(const Tensor& t, std::string_view call, std::string_view argument) const {
  const auto where = [&] {
    return "backend \"" + std::string(name()) + "\", " + std::string(call) + ": " + std::string(argument);
  };
  if (t.empty()) throw BackendError(where() + " is an empty tensor (no buffer)");
  if (t.device() != device())
    throw BackendError(where() + " lives on " + std::string(to_string(t.device())) + ", this backend on " +
                       std::string(to_string(device())) + "; move it with to_host and from_host");
  if (t.element_type() != ElementType::binary32)
    throw BackendError(where() + " holds " + std::string(to_string(t.element_type())) + " elements, not binary32");
}

void Backend::require_shape(bool ok, std::string_view call, std::string_view what) const {
  if (!ok) throw BackendError("backend \"" + std::string(name()) + "\", " + std::string(call) + ": " + std::string(what));
}

// --- Memory -------------------------------------------------------------------------------------------------------

Tensor Backend::zeros(const Shape& shape) {
  for (const auto d : shape) require_shape(d >= 0, "zeros", "negative extent in shape " + shape_text(shape));
  return zeros_impl(shape);
}

Tensor Backend::empty(const Shape& shape) {
  for (const auto d : shape) require_shape(d >= 0, "empty", "negative extent in shape " + shape_text(shape));
  return empty_impl(shape);
}

Tensor Backend::from_host(std::span<const float> values, const Shape& shape) {
  for (const auto d : shape) require_shape(d >= 0, "from_host", "negative extent in shape " + shape_text(shape));
  require_shape(static_cast<std::int64_t>(values.size()) == element_count(shape), "from_host",
                std::to_string(values.size()) + " values for shape " + shape_text(shape));
  return from_host_impl(values, shape);
}

void Backend::to_host(const Tensor& t, std::span<float> out) {
  require_tensor(t, "to_host", "t");
  require_shape(static_cast<std::int64_t>(out.size()) == t.numel(), "to_host",
                "room for " + std::to_string(out.size()) + " values, tensor of shape " + shape_text(t.shape()));
  to_host_impl(t, out);
}

void Backend::copy(const Tensor& from, Tensor& to) {
  require_tensor(from, "copy", "from");
  require_tensor(to, "copy", "to");
  require_shape(from.numel() == to.numel(), "copy",
                "shapes " + shape_text(from.shape()) + " and " + shape_text(to.shape()) + " differ in size");
  copy_impl(from, to);
}

// --- Ops ----------------------------------------------------------------------------------------------------------

RoundResult Backend::round(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                           TensorStats* stats) {
  require_support(Op::round, "round");
  require_tensor(t, "round", "t");
  return round_impl(t, point, scale, stream, stats);
}

void Backend::gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
                   const GemmNumerics& numerics, StochasticStream stream) {
  require_support(Op::gemm, "gemm");
  require_tensor(a, "gemm", "a");
  require_tensor(b, "gemm", "b");
  require_tensor(c, "gemm", "c");
  const std::int64_t m = transpose_a ? a.cols() : a.rows(), k = transpose_a ? a.rows() : a.cols();
  const std::int64_t kb = transpose_b ? b.cols() : b.rows(), n = transpose_b ? b.rows() : b.cols();
  require_shape(k == kb && c.rows() == m && c.cols() == n, "gemm",
                "op(a) is " + std::to_string(m) + "x" + std::to_string(k) + ", op(b) " + std::to_string(kb) + "x" +
                    std::to_string(n) + ", c " + shape_text(c.shape()));
  gemm_impl(a, transpose_a, b, transpose_b, c, numerics, stream);
}

void Backend::add_row_vector(Tensor& x, const Tensor& row) {
  require_support(Op::add_row_vector, "add_row_vector");
  require_tensor(x, "add_row_vector", "x");
  require_tensor(row, "add_row_vector", "row");
  require_shape(row.numel() == x.cols(), "add_row_vector",
                "row of " + std::to_string(row.numel()) + " for x of shape " + shape_text(x.shape()));
  add_row_vector_impl(x, row);
}

void Backend::column_sums(const Tensor& x, Tensor& sums) {
  require_support(Op::column_sums, "column_sums");
  require_tensor(x, "column_sums", "x");
  require_tensor(sums, "column_sums", "sums");
  require_shape(sums.numel() == x.cols(), "column_sums",
                std::to_string(sums.numel()) + " sums for x of shape " + shape_text(x.shape()));
  column_sums_impl(x, sums);
}

void Backend::scale(Tensor& x, float factor) {
  require_support(Op::scale, "scale");
  require_tensor(x, "scale", "x");
  scale_impl(x, factor);
}

double Backend::sum_squares(const Tensor& x) {
  require_support(Op::sum_squares, "sum_squares");
  require_tensor(x, "sum_squares", "x");
  return sum_squares_impl(x);
}

float Backend::max_abs_finite(const Tensor& x) {
  require_support(Op::max_abs_finite, "max_abs_finite");
  require_tensor(x, "max_abs_finite", "x");
  return max_abs_finite_impl(x);
}

namespace {
// The element-wise ops take tensors of one size.
bool same_size(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t->numel() != (*tensors.begin())->numel()) return false;
  return true;
}
}  // namespace

void Backend::require_entry(Op op, bool supported, std::string_view entry, std::string_view call) const {
  require_support(op, call);
  if (!supported)
    throw BackendError("backend \"" + std::string(name()) + "\" does not support " + std::string(entry) +
                       " (called as " + std::string(call) + "); run this arm on a backend that does");
}

void Backend::require_pointwise(std::size_t entry, std::string_view call) const {
  require_entry(Op::pointwise, supports_pointwise(entry), Pointwises::names[entry], call);
}

void Backend::pointwise_forward(const PointwiseCall& op, const Tensor& x, Tensor& y, std::string_view call) {
  require_pointwise(op.index(), call);
  require_tensor(x, call, "x");
  require_tensor(y, call, "y");
  require_shape(same_size({&x, &y}), call, "x and y differ in size");
  if (const std::string why = Pointwises::refusal(op); !why.empty()) require_shape(false, call, why);
  pointwise_forward_impl(op, x, y);
}

void Backend::pointwise_backward(const PointwiseCall& op, const Tensor& saved, const Tensor& dy, Tensor& dx,
                                 std::string_view call) {
  require_pointwise(op.index(), call);
  const bool saves = pointwise_saves(op) != Saves::nothing;
  const char* const saved_name = pointwise_saves(op) == Saves::input ? "x" : "y";
  if (saves) require_tensor(saved, call, saved_name);
  require_tensor(dy, call, "dy");
  require_tensor(dx, call, "dx");
  require_shape(same_size({&dy, &dx}) && (!saves || saved.numel() == dy.numel()), call,
                saves ? std::string(saved_name) + ", dy and dx differ in size" : "dy and dx differ in size");
  if (const std::string why = Pointwises::refusal(op); !why.empty()) require_shape(false, call, why);
  pointwise_backward_impl(op, saves ? saved : Tensor(), dy, dx);
}

void Backend::gated_activation_forward(Activation kind, const Tensor& x, Tensor& y) {
  const std::string_view call = "gated_activation_forward";
  require_pointwise(static_cast<std::size_t>(kind), call);
  require_tensor(x, call, "x");
  require_tensor(y, call, "y");
  require_shape(x.shape().size() == 2 && x.cols() % 2 == 0 && y.shape() == Shape{x.rows(), x.cols() / 2}, call,
                "x needs rows of 2n values [a | b] and y [rows, n]; x is " + shape_text(x.shape()) + ", y " +
                    shape_text(y.shape()));
  gated_activation_forward_impl(kind, x, y);
}

void Backend::gated_activation_backward(Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const std::string_view call = "gated_activation_backward";
  require_pointwise(static_cast<std::size_t>(kind), call);
  for (const auto& [t, n] : {std::pair{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}}) require_tensor(*t, call, n);
  require_shape(x.shape().size() == 2 && x.cols() % 2 == 0 && dy.shape() == Shape{x.rows(), x.cols() / 2} &&
                    dx.shape() == x.shape(),
                call, "x and dx need rows of 2n values, dy [rows, n]");
  gated_activation_backward_impl(kind, x, dy, dx);
}

void Backend::require_row(const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& y,
                          const RowTensors& tensors, bool backward, std::string_view call) const {
  require_entry(Op::row, supports_row(op.index()), Rows::names[op.index()], call);
  require_shape(layout.valid(), call, "the row layout does not fit its groups");
  require_tensor(x, call, "x");
  require_tensor(y, call, backward ? "dx" : "y");
  require_shape(x.numel() == layout.size() && y.numel() == x.numel(), call,
                "x and " + std::string(backward ? "dx" : "y") + " need " + std::to_string(layout.size()) +
                    " values, the layout's groups (x " + shape_text(x.shape()) + ")");
  Rows::visit(op, [&]<typename R>(R, const typename R::Params& p) {
    for (int k = 0; k < 2; ++k) {
      const std::string parameter(R::parameter_names[static_cast<std::size_t>(k)]);
      const std::string statistic(R::statistic_names[static_cast<std::size_t>(k)]);
      const auto check = [&](const Tensor* t, bool needed, const std::string& what, std::int64_t size,
                             const char* per) {
        require_shape((t != nullptr) == needed, call,
                      needed ? what + " is missing" : what + " is not used by " + std::string(R::name) + " here");
        if (!t) return;
        require_tensor(*t, call, what);
        require_shape(t->numel() == size, call, what + " needs " + std::to_string(size) + " values (" + per + ")");
      };
      check(tensors.parameters[k], R::needs_parameter(p, k, backward), parameter, layout.param_count(),
            "its parameter blocks");
      check(tensors.statistics[k], R::needs_statistic(p, k), statistic, layout.segments, "one per segment");
      if (backward)
        check(tensors.parameter_grads[k], R::needs_parameter_grad(p, k), "d" + parameter, layout.param_count(),
              "its parameter blocks");
      else
        require_shape(tensors.parameter_grads[k] == nullptr, call, "the forward pass writes no parameter gradient");
    }
  });
}

void Backend::row_forward(const RowCall& op, const RowLayout& layout, const Tensor& x, Tensor& y,
                          const RowTensors& tensors, std::string_view call) {
  require_row(op, layout, x, y, tensors, false, call);
  row_forward_impl(op, layout, x, y, tensors);
}

void Backend::row_backward(const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& dy,
                           Tensor& dx, const RowTensors& tensors, std::string_view call) {
  require_row(op, layout, x, dx, tensors, true, call);
  require_tensor(dy, call, "dy");
  require_shape(dy.numel() == x.numel(), call, "dy needs x's size");
  row_backward_impl(op, layout, x, dy, dx, tensors);
}

void Backend::layer_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                 Tensor& mean, Tensor& rstd, const InternalRounding& low) {
  require_tensor(x, "layer_norm_forward", "x");
  row_forward(norm_call(eps, true, low), RowLayout::rows(x.rows(), x.cols()), x, y,
              {{&gamma, &beta}, {&mean, &rstd}, {}}, "layer_norm_forward");
}

void Backend::layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                                  const InternalRounding& low) {
  require_tensor(x, "layer_norm_backward", "x");
  // The statistics are read, not written: the pointers are non-const only because the forward writes them.
  row_backward(norm_call(0.0f, true, low), RowLayout::rows(x.rows(), x.cols()), x, dy, dx,
               {{&gamma, nullptr}, {const_cast<Tensor*>(&mean), const_cast<Tensor*>(&rstd)}, {&dgamma, &dbeta}},
               "layer_norm_backward");
}

void Backend::rms_norm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd,
                               const InternalRounding& low) {
  require_tensor(x, "rms_norm_forward", "x");
  row_forward(norm_call(eps, false, low), RowLayout::rows(x.rows(), x.cols()), x, y,
              {{&gamma, nullptr}, {nullptr, &rstd}, {}}, "rms_norm_forward");
}

void Backend::rms_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy,
                                Tensor& dx, Tensor& dgamma, const InternalRounding& low) {
  require_tensor(x, "rms_norm_backward", "x");
  row_backward(norm_call(0.0f, false, low), RowLayout::rows(x.rows(), x.cols()), x, dy, dx,
               {{&gamma, nullptr}, {nullptr, const_cast<Tensor*>(&rstd)}, {&dgamma, nullptr}}, "rms_norm_backward");
}

namespace {
std::int64_t image_size(const ConvGeometry& g) { return g.batch * g.channels * g.height * g.width; }
std::int64_t patch_rows_size(const ConvGeometry& g) {
  return g.batch * g.out_height() * g.out_width() * g.channels * g.kernel * g.kernel;
}
std::int64_t pooled_size(const ConvGeometry& g) { return g.batch * g.channels * g.out_height() * g.out_width(); }
}  // namespace

void Backend::im2col(const Tensor& x, const ConvGeometry& g, Tensor& columns) {
  require_support(Op::im2col, "im2col");
  require_tensor(x, "im2col", "x");
  require_tensor(columns, "im2col", "columns");
  require_shape(x.numel() == image_size(g) && columns.numel() == patch_rows_size(g), "im2col",
                "x or columns does not fit the geometry");
  im2col_impl(x, g, columns);
}

void Backend::col2im(const Tensor& columns, const ConvGeometry& g, Tensor& dx) {
  require_support(Op::col2im, "col2im");
  require_tensor(columns, "col2im", "columns");
  require_tensor(dx, "col2im", "dx");
  require_shape(dx.numel() == image_size(g) && columns.numel() == patch_rows_size(g), "col2im",
                "columns or dx does not fit the geometry");
  col2im_impl(columns, g, dx);
}

void Backend::rows_to_nchw(const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w, Tensor& nchw) {
  require_support(Op::rows_to_nchw, "rows_to_nchw");
  require_tensor(rows, "rows_to_nchw", "rows");
  require_tensor(nchw, "rows_to_nchw", "nchw");
  require_shape(rows.rows() == batch * h * w && rows.numel() == nchw.numel(), "rows_to_nchw",
                "rows " + shape_text(rows.shape()) + " and nchw " + shape_text(nchw.shape()) +
                    " do not hold batch*h*w rows of the same values");
  rows_to_nchw_impl(rows, batch, h, w, nchw);
}

void Backend::nchw_to_rows(const Tensor& nchw, Tensor& rows) {
  require_support(Op::nchw_to_rows, "nchw_to_rows");
  require_tensor(nchw, "nchw_to_rows", "nchw");
  require_tensor(rows, "nchw_to_rows", "rows");
  require_shape(nchw.shape().size() == 4 && rows.numel() == nchw.numel(), "nchw_to_rows",
                "nchw " + shape_text(nchw.shape()) + " must be 4-D and rows " + shape_text(rows.shape()) +
                    " of the same size");
  nchw_to_rows_impl(nchw, rows);
}

void Backend::max_pool_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) {
  require_support(Op::max_pool, "max_pool_forward");
  require_tensor(x, "max_pool_forward", "x");
  require_tensor(y, "max_pool_forward", "y");
  require_tensor(argmax, "max_pool_forward", "argmax");
  require_shape(x.numel() == image_size(g) && y.numel() == pooled_size(g) && argmax.numel() == pooled_size(g),
                "max_pool_forward", "x, y or argmax does not fit the geometry");
  max_pool_forward_impl(x, g, y, argmax);
}

void Backend::max_pool_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  require_support(Op::max_pool, "max_pool_backward");
  require_tensor(dy, "max_pool_backward", "dy");
  require_tensor(argmax, "max_pool_backward", "argmax");
  require_tensor(dx, "max_pool_backward", "dx");
  require_shape(dy.numel() == argmax.numel(), "max_pool_backward", "dy and argmax differ in size");
  max_pool_backward_impl(dy, argmax, dx);
}

void Backend::add(Tensor& x, const Tensor& y) {
  require_support(Op::add, "add");
  require_tensor(x, "add", "x");
  require_tensor(y, "add", "y");
  require_shape(same_size({&x, &y}), "add", "x and y differ in size");
  add_impl(x, y);
}

namespace {
// Checks an AttentionShape and the tensors' sizes against it.
std::string attention_shape_problem(const AttentionShape& s) {
  if (s.batch < 0 || s.tokens < 0 || s.heads <= 0 || s.head_dim <= 0)
    return "batch " + std::to_string(s.batch) + ", tokens " + std::to_string(s.tokens) + ", heads " +
           std::to_string(s.heads) + ", head_dim " + std::to_string(s.head_dim) +
           ": heads and head_dim must be positive, batch and tokens not negative";
  return {};
}
}  // namespace

void Backend::require_attention(const AttentionShape& s, std::string_view call,
                                std::initializer_list<std::pair<const Tensor*, const char*>> qkv_sized,
                                std::initializer_list<std::pair<const Tensor*, const char*>> score_sized,
                                std::initializer_list<std::pair<const Tensor*, const char*>> output_sized) const {
  require_support(Op::attention, call);
  const std::string problem = attention_shape_problem(s);
  require_shape(problem.empty(), call, problem);
  const auto check = [&](const auto& list, std::int64_t rows, std::int64_t cols, const char* what) {
    for (const auto& [t, n] : list) {
      require_tensor(*t, call, n);
      require_shape(t->numel() == rows * cols && (t->rows() == rows || rows == 0), call,
                    std::string(n) + " of shape " + shape_text(t->shape()) + " where " + what + " [" +
                        std::to_string(rows) + ", " + std::to_string(cols) + "] fits");
    }
  };
  check(qkv_sized, s.rows(), 3 * s.width(), "qkv");
  check(score_sized, s.score_rows(), s.tokens, "scores");
  check(output_sized, s.rows(), s.width(), "the output");
}

void Backend::qk_norm_forward(const Tensor& qkv, const Tensor& gamma, const Tensor& beta, const AttentionShape& shape,
                              float eps, Tensor& y, Tensor& mean, Tensor& rstd, const InternalRounding& low) {
  const std::string_view call = "qk_norm_forward";
  require_attention(shape, call, {{&qkv, "qkv"}, {&y, "y"}}, {}, {});
  row_forward(norm_call(eps, true, low), RowLayout::qk_heads(shape), qkv, y, {{&gamma, &beta}, {&mean, &rstd}, {}},
              call);
}
void Backend::qk_norm_backward(const Tensor& qkv, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                               const Tensor& dy, const AttentionShape& shape, Tensor& dx, Tensor& dgamma,
                               Tensor& dbeta, const InternalRounding& low) {
  const std::string_view call = "qk_norm_backward";
  require_attention(shape, call, {{&qkv, "qkv"}, {&dy, "dy"}, {&dx, "dx"}}, {}, {});
  row_backward(norm_call(0.0f, true, low), RowLayout::qk_heads(shape), qkv, dy, dx,
               {{&gamma, nullptr}, {const_cast<Tensor*>(&mean), const_cast<Tensor*>(&rstd)}, {&dgamma, &dbeta}},
               call);
}

void Backend::attention_scores(const Tensor& qkv, const AttentionShape& shape, Tensor& scores) {
  require_attention(shape, "attention_scores", {{&qkv, "qkv"}}, {{&scores, "scores"}}, {});
  attention_scores_impl(qkv, shape, scores);
}
void Backend::attention_values(const Tensor& probs, const Tensor& qkv, const AttentionShape& shape, Tensor& out) {
  require_attention(shape, "attention_values", {{&qkv, "qkv"}}, {{&probs, "probs"}}, {{&out, "out"}});
  attention_values_impl(probs, qkv, shape, out);
}
void Backend::attention_values_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                        const AttentionShape& shape, Tensor& dprobs, Tensor& dqkv) {
  require_attention(shape, "attention_values_backward", {{&qkv, "qkv"}, {&dqkv, "dqkv"}},
                    {{&probs, "probs"}, {&dprobs, "dprobs"}}, {{&dout, "dout"}});
  attention_values_backward_impl(probs, qkv, dout, shape, dprobs, dqkv);
}
void Backend::attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const AttentionShape& shape,
                                        Tensor& dqkv) {
  require_attention(shape, "attention_scores_backward", {{&qkv, "qkv"}, {&dqkv, "dqkv"}}, {{&dscores, "dscores"}},
                    {});
  attention_scores_backward_impl(dscores, qkv, shape, dqkv);
}
void Backend::fused_attention_forward(const Tensor& qkv, const AttentionShape& shape, const FusedAttention& fused,
                                      Tensor& out, Tensor& lse, Tensor& logit_max) {
  const std::string_view call = "fused_attention_forward";
  require_attention(shape, call, {{&qkv, "qkv"}}, {}, {{&out, "out"}});
  require_shape(fused.block >= 1 && fused.block <= FusedAttention::max_block, call,
                "a tile of " + std::to_string(fused.block) + " keys; tiles hold 1 to " +
                    std::to_string(FusedAttention::max_block));
  for (const auto& [t, n] : {std::pair{&lse, "lse"}, {&logit_max, "logit_max"}}) {
    require_tensor(*t, call, n);
    require_shape(t->numel() == shape.score_rows(), call, std::string(n) + " needs one value per score row");
  }
  fused_attention_forward_impl(qkv, shape, fused, out, lse, logit_max);
}
void Backend::fused_attention_probs(const Tensor& scores, const Tensor& lse, Tensor& probs) {
  const std::string_view call = "fused_attention_probs";
  require_support(Op::attention, call);
  for (const auto& [t, n] : {std::pair{&scores, "scores"}, {&lse, "lse"}, {&probs, "probs"}}) require_tensor(*t, call, n);
  require_shape(same_size({&scores, &probs}) && scores.shape().size() == 2 && lse.numel() == scores.rows(), call,
                "scores and probs must be the same matrix, lse one value per row");
  fused_attention_probs_impl(scores, lse, probs);
}
void Backend::fused_attention_row_dot(const Tensor& dout, const Tensor& out, const AttentionShape& shape,
                                      Tensor& dot) {
  const std::string_view call = "fused_attention_row_dot";
  require_attention(shape, call, {}, {}, {{&dout, "dout"}, {&out, "out"}});
  require_tensor(dot, call, "dot");
  require_shape(dot.numel() == shape.score_rows(), call, "dot needs one value per score row");
  fused_attention_row_dot_impl(dout, out, shape, dot);
}
void Backend::fused_attention_scores_grad(const Tensor& probs, const Tensor& dprobs, const Tensor& dot,
                                          Tensor& dscores) {
  const std::string_view call = "fused_attention_scores_grad";
  require_support(Op::attention, call);
  for (const auto& [t, n] : {std::pair{&probs, "probs"}, {&dprobs, "dprobs"}, {&dot, "dot"}, {&dscores, "dscores"}})
    require_tensor(*t, call, n);
  require_shape(same_size({&probs, &dprobs, &dscores}) && probs.shape().size() == 2 && dot.numel() == probs.rows(),
                call, "probs, dprobs and dscores must be the same matrix, dot one value per row");
  fused_attention_scores_grad_impl(probs, dprobs, dot, dscores);
}

void Backend::softmax_forward(const Tensor& x, Tensor& probs, const InternalRounding& low) {
  require_support(Op::softmax, "softmax_forward");
  require_tensor(x, "softmax_forward", "x");
  require_tensor(probs, "softmax_forward", "probs");
  require_shape(same_size({&x, &probs}), "softmax_forward", "x and probs differ in size");
  softmax_forward_impl(x, probs, low);
}
void Backend::softmax_backward(const Tensor& probs, const Tensor& dprobs, Tensor& dx,
                               const InternalRounding& low) {
  require_support(Op::softmax, "softmax_backward");
  require_tensor(probs, "softmax_backward", "probs");
  require_tensor(dprobs, "softmax_backward", "dprobs");
  require_tensor(dx, "softmax_backward", "dx");
  require_shape(same_size({&probs, &dprobs, &dx}), "softmax_backward", "probs, dprobs and dx differ in size");
  softmax_backward_impl(probs, dprobs, dx, low);
}

void Backend::rotary(const Tensor& qkv, const Tensor& table, const AttentionShape& shape, bool inverse, Tensor& y) {
  const std::string_view call = "rotary";
  require_support(Op::rotary, call);
  require_attention(shape, call, {{&qkv, "qkv"}, {&y, "y"}}, {}, {});
  require_tensor(table, call, "table");
  require_shape(shape.head_dim % 2 == 0, call, "rotary embeddings pair a head's features: head_dim must be even");
  require_shape(table.numel() == shape.tokens * shape.head_dim, call,
                "the table needs 2 x tokens x head_dim / 2 values (cos, then sin)");
  require_shape(qkv.buffer() != y.buffer(), call, "y must not be qkv: each output reads its pair's other input");
  rotary_impl(qkv, table, shape, inverse, y);
}

void Backend::sequence_mean_forward(const Tensor& x, std::int64_t tokens, Tensor& y) {
  require_support(Op::sequence_mean, "sequence_mean_forward");
  require_tensor(x, "sequence_mean_forward", "x");
  require_tensor(y, "sequence_mean_forward", "y");
  require_shape(tokens > 0 && x.rows() % tokens == 0 && y.rows() == x.rows() / tokens && y.cols() == x.cols(),
                "sequence_mean_forward",
                "x " + shape_text(x.shape()) + " of " + std::to_string(tokens) + " tokens per sample and y " +
                    shape_text(y.shape()) + " do not fit: y needs x's rows / tokens rows and x's columns");
  sequence_mean_forward_impl(x, tokens, y);
}
void Backend::sequence_mean_backward(const Tensor& dy, std::int64_t tokens, Tensor& dx) {
  require_support(Op::sequence_mean, "sequence_mean_backward");
  require_tensor(dy, "sequence_mean_backward", "dy");
  require_tensor(dx, "sequence_mean_backward", "dx");
  require_shape(tokens > 0 && dx.rows() == dy.rows() * tokens && dy.cols() == dx.cols(), "sequence_mean_backward",
                "dy " + shape_text(dy.shape()) + " and dx " + shape_text(dx.shape()) + " do not fit " +
                    std::to_string(tokens) + " tokens per sample");
  sequence_mean_backward_impl(dy, tokens, dx);
}

void Backend::embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  require_support(Op::embedding, "embedding_forward");
  require_tensor(ids, "embedding_forward", "ids");
  require_tensor(table, "embedding_forward", "table");
  require_tensor(out, "embedding_forward", "out");
  require_shape(out.rows() == ids.numel() && out.cols() == table.cols(), "embedding_forward",
                "out " + shape_text(out.shape()) + " needs a row per id (" + std::to_string(ids.numel()) +
                    ") of the table's width (table " + shape_text(table.shape()) + ")");
  embedding_forward_impl(ids, table, out);
}
void Backend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  require_support(Op::embedding, "embedding_backward");
  require_tensor(ids, "embedding_backward", "ids");
  require_tensor(dout, "embedding_backward", "dout");
  require_tensor(dtable, "embedding_backward", "dtable");
  require_shape(dout.rows() == ids.numel() && dout.cols() == dtable.cols(), "embedding_backward",
                "dout " + shape_text(dout.shape()) + " needs a row per id (" + std::to_string(ids.numel()) +
                    ") of the table's width (dtable " + shape_text(dtable.shape()) + ")");
  embedding_backward_impl(ids, dout, dtable);
}

namespace {
// Logits [rows, classes], one label per row, a gradient of the logits' size.
bool loss_shapes(const Tensor& logits, const Tensor& labels, const Tensor& d_logits) {
  return labels.numel() == logits.rows() && d_logits.numel() == logits.numel();
}
}  // namespace

LossResult Backend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                          Tensor& d_logits) {
  const std::string_view call = "softmax_cross_entropy";
  require_support(Op::softmax_cross_entropy, call);
  require_tensor(logits, call, "logits");
  require_tensor(labels, call, "labels");
  require_tensor(d_logits, call, "d_logits");
  require_shape(loss_shapes(logits, labels, d_logits), call,
                "need one label per row of logits " + shape_text(logits.shape()) + " and d_logits of their size");
  return softmax_cross_entropy_impl(logits, labels, grad_scale, d_logits);
}

void Backend::round_delayed(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                            StochasticStream stream, TensorStats* stats) {
  require_support(Op::round_delayed, "round_delayed");
  require_tensor(t, "round_delayed", "t");
  require_tensor(history, "round_delayed", "history");
  require_shape(point.delayed_scaling && history.numel() >= 2, "round_delayed",
                "needs a scaled point and a history of at least one amax and its position");
  round_delayed_impl(t, point, history, margin, record, stream, stats);
}

// --- The training step --------------------------------------------------------------------------------------------

void Backend::start_steps(const LossScaling& scaling, const LossDefinition& loss, const InternalRounding& loss_low) {
  require_support(Op::training_step, "start_steps");
  start_steps_impl(scaling, loss, loss_low);
}

void Backend::step_loss(const Tensor& logits, const Tensor& labels, Tensor& d_logits) {
  require_support(Op::training_step, "step_loss");
  require_tensor(logits, "step_loss", "logits");
  require_tensor(labels, "step_loss", "labels");
  require_tensor(d_logits, "step_loss", "d_logits");
  require_shape(loss_shapes(logits, labels, d_logits), "step_loss",
                "need one label per row of logits " + shape_text(logits.shape()) + " and d_logits of their size");
  step_loss_impl(logits, labels, d_logits);
}

void Backend::step_check_gradient(const Tensor& grad) {
  require_support(Op::training_step, "step_check_gradient");
  require_tensor(grad, "step_check_gradient", "grad");
  step_check_gradient_impl(grad);
}

void Backend::end_step() {
  require_support(Op::training_step, "end_step");
  end_step_impl();
}

void Backend::optimizer_step(const OptimizerParams& params, Tensor& weight, Tensor& grad, Tensor& state1,
                             Tensor& state2, Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                             TensorStats* stats) {
  const std::string_view call = "optimizer_step";
  require_support(Op::training_step, call);
  require_tensor(weight, call, "weight");
  require_tensor(grad, call, "grad");
  require_tensor(update, call, "update");
  require_shape(same_size({&weight, &grad, &update}), call, "weight, grad and update differ in size");
  const bool sgd = params.kind == OptimizerKind::sgd;
  if (!sgd || params.momentum != 0.0f) {
    require_tensor(state1, call, sgd ? "state1 (momentum)" : "state1 (m)");
    require_shape(state1.numel() == weight.numel(), call, "state1 differs from the weight in size");
  }
  if (!sgd) {
    require_tensor(state2, call, "state2 (v)");
    require_shape(state2.numel() == weight.numel(), call, "state2 differs from the weight in size");
  }
  optimizer_step_impl(params, weight, grad, state1, state2, update, storage, stream, stats);
}

void Backend::round_state(Tensor& state, const RoundingPoint& point, Tensor* history, int margin,
                          StochasticStream stream) {
  require_support(Op::training_step, "round_state");
  require_tensor(state, "round_state", "state");
  if (history) {
    require_tensor(*history, "round_state", "history");
    require_shape(point.delayed_scaling && history->numel() >= 2, "round_state",
                  "a history needs a scaled point and room for at least one amax and its position");
  }
  round_state_impl(state, point, history, margin, stream);
}

std::vector<StepScalars> Backend::take_steps() {
  require_support(Op::training_step, "take_steps");
  return take_steps_impl();
}

}  // namespace mpsim::core
