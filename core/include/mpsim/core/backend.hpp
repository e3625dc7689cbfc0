#pragma once
// The operations a training step needs, written once in core against this
// interface. The CPU backend implements them with Eigen and emulation/; the
// GPU backend (gpu/) with cuBLAS and CUDA kernels. No CUDA type appears here.
//
// Every op computes in binary32 unless it says otherwise; rounding to a
// storage format happens only in `round`, `gemm` (when the accumulation
// format is not binary32) and `apply_update`, at the points a Policy names.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/numerics_ops.hpp"
#include "mpsim/core/numerics_rows.hpp"
#include "mpsim/core/names.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/stats.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/tensor.hpp"
#include "mpsim/emulation/quantize.hpp"

namespace mpsim::core {

// The CPU backend's binary32 GEMM (config `train.gemm`): `ordered`, the
// fixed-order kernel that gives the same bits on every CPU and thread count
// (ordered_gemm.hpp), or `blas`, OpenBLAS, whose kernel and summation order
// depend on the CPU model and the thread count.
enum class CpuGemm { ordered, blas };
inline constexpr EnumNames<CpuGemm, 2> cpu_gemm_names{{"ordered", "blas"}};
inline std::string_view to_string(CpuGemm gemm) { return cpu_gemm_names(gemm); }

// The CUDA backend's attention products (config `train.attention`):
// `kernels`, one thread per output summing in the CPU backend's order (the
// same bits up to expf), or `cublas`, batched cuBLAS GEMMs in binary32 (no
// TF32) in cuBLAS's order, as a GPU training framework computes them.
enum class DeviceAttention { kernels, cublas };
inline constexpr EnumNames<DeviceAttention, 2> device_attention_names{{"kernels", "cublas"}};
inline std::string_view to_string(DeviceAttention attention) { return device_attention_names(attention); }

struct ConvGeometry {
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;
  std::int64_t kernel = 0, stride = 1, padding = 0;
  std::int64_t out_height() const { return (height + 2 * padding - kernel) / stride + 1; }
  std::int64_t out_width() const { return (width + 2 * padding - kernel) / stride + 1; }
};

// How a GEMM computes. The operands' values are exact in their formats (a
// scaled point's values are its format's values times a power of two), so a
// GPU backend can pick its Tensor Core input type from them without changing
// a value. The sum over k runs in binary32, or, when accumulation's format is
// not binary32, rounds after every multiply-add (products exact, k in
// increasing order).
struct GemmNumerics {
  Format a_format = formats::binary32;
  Format b_format = formats::binary32;
  RoundingPoint accumulation;
  // A model of how the sum runs (Policy::gemm), replacing `accumulation`
  // when present. An emulating backend follows it; on a GPU the hardware is
  // the model, so the GPU backend ignores it.
  std::optional<AccumulationModel> model;
  // Block-scaled operands (both or neither): each operand, as op(a) and
  // op(b) present it, quantized along k to its block point (after the
  // Hadamard transform when the points ask, seeded by hadamard_seed), then
  // multiplied as block_gemm.hpp's block-scaled tensor cores do, promoting
  // through `block_promotion` when set. Statistics go to each `stats`.
  struct BlockOperand {
    BlockPoint point;
    StochasticStream stream;
    BlockStats* stats = nullptr;
  };
  std::optional<BlockOperand> a_block, b_block;
  std::optional<TensorCoreModel> block_promotion;
  int block_promotion_interval = 0;  // E8M0/UE4M3 scales with a tensor core: block_gemm.hpp (0: never)
  std::uint64_t hadamard_seed = 0;
};

struct RoundResult {
  float amax = 0.0f;  // largest |x| before rounding and scaling (NaN ignored), for delayed scaling
};

struct LossResult {
  double loss_sum = 0.0;      // sum over the batch of -log softmax(logits)[label], in binary64
  std::int64_t correct = 0;   // argmax(logits) == label
};

// One training step's scalars as the backend decided them (the step ops below).
struct StepScalars {
  double loss_sum = 0.0;          // over the batch, as LossResult
  std::int64_t correct = 0;
  double grad_sum_squares = 0.0;  // of the loss-scaled gradients, binary64, summed in parameter order
  double loss_scale = 1.0;        // the factor this step's loss gradient was multiplied by
  bool found_inf = false;         // loss or a gradient inf or NaN: the optimiser step did not run
};

enum class OptimizerKind : std::uint8_t { sgd, adam, adamw };
inline constexpr EnumNames<OptimizerKind, 3> optimizer_kind_names{{"sgd", "adam", "adamw"}};
inline std::string_view to_string(OptimizerKind kind) { return optimizer_kind_names(kind); }

// One optimiser step's hyperparameters (PyTorch's names and formulas).
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.0f, momentum = 0.0f, weight_decay = 0.0f;  // momentum: SGD only
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;       // Adam and AdamW only
  float clip_norm = 0.0f;  // > 0: the step's gradients clipped to this global norm (numerics.hpp's clip_factor)
};

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;     // AdamW
  std::int64_t step;  // 1-based, for bias correction
};

// Every operation of the interface, one name table: Backend::supports and
// the errors name them.
enum class Op : std::uint8_t {
  round, gemm, add_row_vector, column_sums, scale, sum_squares, pointwise, row, im2col, col2im,
  rows_to_nchw, nchw_to_rows, max_pool, softmax_cross_entropy, round_delayed, training_step,
  add, attention, softmax, sequence_mean, embedding, max_abs_finite, rotary
};
inline constexpr EnumNames<Op, 23> op_names{{"round", "gemm", "add_row_vector", "column_sums", "scale",
                                             "sum_squares", "pointwise", "row", "im2col", "col2im",
                                             "rows_to_nchw", "nchw_to_rows", "max_pool", "softmax_cross_entropy",
                                             "round_delayed", "training_step", "add", "attention", "softmax",
                                             "sequence_mean", "embedding", "max_abs_finite", "rotary"}};
inline std::string_view to_string(Op op) { return op_names(op); }

// What a backend throws when asked for an operation it does not support
// (Backend::supports), or when a call's tensors do not fit it: the message
// names the backend, the call and what is wrong.
class BackendError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Every implementation a backend writes, once, as X(result, op, (parameters),
// (arguments)): the public call `op` checks its tensors and runs `op_impl`.
// Backend declares each `op_impl` from this list, and the tests'
// ForwardingBackend forwards each, so neither is written by hand for a new op
// (its public call, with its checks, and each backend's override still are).
#define MPSIM_BACKEND_IMPLEMENTATIONS(X) \
  X(Tensor, zeros, (const Shape& shape), (shape)) \
  X(Tensor, empty, (const Shape& shape), (shape)) \
  X(Tensor, from_host, (std::span<const float> values, const Shape& shape), (values, shape)) \
  X(void, to_host, (const Tensor& t, std::span<float> out), (t, out)) \
  X(void, copy, (const Tensor& from, Tensor& to), (from, to)) \
  X(RoundResult, round, (Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream, \
      TensorStats* stats), (t, point, scale, stream, stats)) \
  X(void, gemm, (const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c, \
      const GemmNumerics& numerics, StochasticStream stream), (a, transpose_a, b, transpose_b, c, numerics, stream)) \
  X(void, add_row_vector, (Tensor& x, const Tensor& row), (x, row)) \
  X(void, column_sums, (const Tensor& x, Tensor& sums), (x, sums)) \
  X(void, scale, (Tensor& x, float factor), (x, factor)) \
  X(double, sum_squares, (const Tensor& x), (x)) \
  X(float, max_abs_finite, (const Tensor& x), (x)) \
  /* `saved` is empty when the entry saves nothing. */ \
  X(void, pointwise_forward, (const PointwiseCall& op, const Tensor& x, Tensor& y), (op, x, y)) \
  X(void, pointwise_backward, (const PointwiseCall& op, const Tensor& saved, const Tensor& dy, Tensor& dx), (op, \
      saved, dy, dx)) \
  X(void, gated_activation_forward, (Activation kind, const Tensor& x, Tensor& y), (kind, x, y)) \
  X(void, gated_activation_backward, (Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx), (kind, x, dy, \
      dx)) \
  X(void, row_forward, (const RowCall& op, const RowLayout& layout, const Tensor& x, Tensor& y, \
      const RowTensors& tensors), (op, layout, x, y, tensors)) \
  X(void, row_backward, (const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& dy, Tensor& dx, \
      const RowTensors& tensors), (op, layout, x, dy, dx, tensors)) \
  X(void, im2col, (const Tensor& x, const ConvGeometry& g, Tensor& columns), (x, g, columns)) \
  X(void, col2im, (const Tensor& columns, const ConvGeometry& g, Tensor& dx), (columns, g, dx)) \
  X(void, rows_to_nchw, (const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w, Tensor& nchw), \
      (rows, batch, h, w, nchw)) \
  X(void, nchw_to_rows, (const Tensor& nchw, Tensor& rows), (nchw, rows)) \
  X(void, max_pool_forward, (const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax), (x, g, y, argmax)) \
  X(void, max_pool_backward, (const Tensor& dy, const Tensor& argmax, Tensor& dx), (dy, argmax, dx)) \
  X(void, add, (Tensor& x, const Tensor& y), (x, y)) \
  X(void, attention_scores, (const Tensor& qkv, const AttentionShape& shape, Tensor& scores), (qkv, shape, scores)) \
  X(void, attention_values, (const Tensor& probs, const Tensor& qkv, const AttentionShape& shape, Tensor& out), \
      (probs, qkv, shape, out)) \
  X(void, attention_values_backward, (const Tensor& probs, const Tensor& qkv, const Tensor& dout, \
      const AttentionShape& shape, Tensor& dprobs, Tensor& dqkv), (probs, qkv, dout, shape, dprobs, dqkv)) \
  X(void, attention_scores_backward, (const Tensor& dscores, const Tensor& qkv, const AttentionShape& shape, \
      Tensor& dqkv), (dscores, qkv, shape, dqkv)) \
  X(void, fused_attention_forward, (const Tensor& qkv, const AttentionShape& shape, const FusedAttention& fused, \
      Tensor& out, Tensor& lse, Tensor& logit_max), (qkv, shape, fused, out, lse, logit_max)) \
  X(void, fused_attention_probs, (const Tensor& scores, const Tensor& lse, Tensor& probs), (scores, lse, probs)) \
  X(void, fused_attention_row_dot, (const Tensor& dout, const Tensor& out, const AttentionShape& shape, \
      Tensor& dot), (dout, out, shape, dot)) \
  X(void, fused_attention_scores_grad, (const Tensor& probs, const Tensor& dprobs, const Tensor& dot, \
      Tensor& dscores), (probs, dprobs, dot, dscores)) \
  X(void, softmax_forward, (const Tensor& x, Tensor& probs, const InternalRounding& low), (x, probs, low)) \
  X(void, softmax_backward, (const Tensor& probs, const Tensor& dprobs, Tensor& dx, const InternalRounding& low), \
      (probs, dprobs, dx, low)) \
  X(void, rotary, (const Tensor& qkv, const Tensor& table, const AttentionShape& shape, bool inverse, Tensor& y), \
      (qkv, table, shape, inverse, y)) \
  X(void, sequence_mean_forward, (const Tensor& x, std::int64_t tokens, Tensor& y), (x, tokens, y)) \
  X(void, sequence_mean_backward, (const Tensor& dy, std::int64_t tokens, Tensor& dx), (dy, tokens, dx)) \
  X(void, embedding_forward, (const Tensor& ids, const Tensor& table, Tensor& out), (ids, table, out)) \
  X(void, embedding_backward, (const Tensor& ids, const Tensor& dout, Tensor& dtable), (ids, dout, dtable)) \
  X(LossResult, softmax_cross_entropy, (const Tensor& logits, const Tensor& labels, float grad_scale, \
      Tensor& d_logits), (logits, labels, grad_scale, d_logits)) \
  X(void, round_delayed, (Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record, \
      StochasticStream stream, TensorStats* stats), (t, point, history, margin, record, stream, stats)) \
  X(void, start_steps, (const LossScaling& scaling, const LossDefinition& loss, const InternalRounding& loss_low), \
      (scaling, loss, loss_low)) \
  X(void, step_loss, (const Tensor& logits, const Tensor& labels, Tensor& d_logits), (logits, labels, d_logits)) \
  X(void, step_check_gradient, (const Tensor& grad), (grad)) \
  X(void, end_step, (), ()) \
  X(void, optimizer_step, (const OptimizerParams& params, Tensor& weight, Tensor& grad, Tensor& state1, \
      Tensor& state2, Tensor& update, const RoundingPoint& storage, StochasticStream stream, TensorStats* stats), \
      (params, weight, grad, state1, state2, update, storage, stream, stats)) \
  X(void, round_state, (Tensor& state, const RoundingPoint& point, Tensor* history, int margin, \
      StochasticStream stream), (state, point, history, margin, stream)) \
  X(std::vector<StepScalars>, take_steps, (), ())

// The interface is checked once, at the door: every public call is a
// non-virtual function that validates its tensors (not empty where they are
// read or written, on this backend's device, binary32, shapes that fit each
// other) and asks supports(op), then runs the backend's protected
// implementation (the *_impl functions), which trusts its inputs.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Where the tensors this backend makes live; it accepts no others.
  virtual Device device() const = 0;
  // False for an operation this backend does not implement: calling it
  // throws BackendError rather than falling back to anything.
  virtual bool supports(Op) const { return true; }
  // The same for each entry of the element-wise table (numerics_ops.hpp's
  // Pointwises, by index; an Activation's index is its own), when the
  // backend supports Op::pointwise.
  virtual bool supports_pointwise(std::size_t /*entry*/) const { return true; }
  // The same for each entry of the row-wise table (numerics_rows.hpp's Rows),
  // when the backend supports Op::row.
  virtual bool supports_row(std::size_t /*entry*/) const { return true; }
  // Why this backend cannot run a block-scaled GEMM (GemmNumerics::a_block)
  // whose operands round to points a and b, through the tensor-core model
  // `promotion` when set (GemmNumerics::block_promotion, with the policy's
  // block_promotion_interval); empty when it can. Checked for every arm before
  // a run starts (block_scaled_gemm.hpp).
  virtual std::string block_gemm_refusal(const BlockPoint&, const BlockPoint&,
                                         const std::optional<TensorCoreModel>& /*promotion*/,
                                         int /*promotion_interval*/) const {
    return {};
  }
  // Why this backend cannot run an optimiser with these settings (empty
  // when it can); checked for every arm before a run starts.
  virtual std::string optimizer_refusal(const OptimizerParams&) const { return {}; }
  virtual void set_threads(int threads) = 0;
  // Which binary32 GEMM the products without an accumulation model use; a
  // backend with one GEMM (the GPU's cuBLAS) ignores it.
  virtual void set_cpu_gemm(CpuGemm) {}
  // How attention's products run; a backend with one way (the CPU's) ignores it.
  virtual void set_device_attention(DeviceAttention) {}
  // What computes those products under `gemm` and `attention`, for the log:
  // "ordered (AVX2)", "blas (OpenBLAS 0.3.21, Zen kernels)", "cuBLAS,
  // attention kernels".
  virtual std::string describe_gemm(CpuGemm gemm, DeviceAttention attention) const = 0;

  // Memory.
  Tensor zeros(const Shape& shape);
  Tensor empty(const Shape& shape);  // contents unspecified: for outputs an op writes whole
  Tensor from_host(std::span<const float> values, const Shape& shape);
  void to_host(const Tensor& t, std::span<float> out);
  void copy(const Tensor& from, Tensor& to);

  // Rounds t in place to the point's format: x -> round(x * scale) / scale,
  // scale a power of two. When stats is not null, adds the histogram of the
  // values x * scale before rounding and the rounding's counters to it.
  RoundResult round(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                    TensorStats* stats);

  // c = op(a) * op(b), op = transpose when asked, as `numerics` says.
  void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
            const GemmNumerics& numerics, StochasticStream stream);
  void add_row_vector(Tensor& x, const Tensor& row);  // x[i, :] += row
  void column_sums(const Tensor& x, Tensor& sums);    // sums[j] = sum_i x[i, j]
  void scale(Tensor& x, float factor);                // x *= factor
  double sum_squares(const Tensor& x);                // in binary64; inf/NaN propagate
  // The largest finite |x| (0 when there is none; infinities, such as a
  // mask's -inf, and NaN ignored): the logit maxima the log keeps. Waits.
  float max_abs_finite(const Tensor& x);

  // Any op of the element-wise table (numerics_ops.hpp): y = forward(x) and
  // dx = backward(saved, dy), `saved` the forward's input or output as the
  // entry says (an empty tensor when it saves nothing). y may be x, dx dy.
  void pointwise_forward(const PointwiseCall& op, const Tensor& x, Tensor& y) {
    pointwise_forward(op, x, y, "pointwise_forward");
  }
  void pointwise_backward(const PointwiseCall& op, const Tensor& saved, const Tensor& dy, Tensor& dx) {
    pointwise_backward(op, saved, dy, dx, "pointwise_backward");
  }
  // Entries by their own names. An activation (numerics_layers.hpp: ReLU,
  // GELU with the exact erf form, ...): y = f(x) and dx = f'(x) dy.
  void activation_forward(Activation kind, const Tensor& x, Tensor& y) {
    pointwise_forward(activation_call(kind), x, y, "activation_forward");
  }
  void activation_backward(Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx) {
    pointwise_backward(activation_call(kind), x, dy, dx, "activation_backward");
  }
  // A gated linear unit (numerics_layers.hpp's gated_*): x [rows, 2n] as
  // [a | b] -> y [rows, n] = f(a) * b, and dx [rows, 2n] = [da | db].
  void gated_activation_forward(Activation kind, const Tensor& x, Tensor& y);
  void gated_activation_backward(Activation kind, const Tensor& x, const Tensor& dy, Tensor& dx);
  // Any op of the row-wise table (numerics_rows.hpp) on the segments
  // `layout` places in x: y = forward(x), and backward dx (the rest of each
  // group passes: y and dx copy it from x and dy) and the parameters'
  // gradients. `tensors` holds the entry's parameters (layout.param_count()
  // values each), its statistics (one value per segment: written forward,
  // read backward) and, backward, the parameters' gradients (written whole):
  // those the entry needs with these parameters, and null for the others.
  struct RowTensors {
    std::array<const Tensor*, 2> parameters{};
    std::array<Tensor*, 2> statistics{};
    std::array<Tensor*, 2> parameter_grads{};
  };
  void row_forward(const RowCall& op, const RowLayout& layout, const Tensor& x, Tensor& y, const RowTensors& tensors) {
    row_forward(op, layout, x, y, tensors, "row_forward");
  }
  void row_backward(const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& dy, Tensor& dx,
                    const RowTensors& tensors) {
    row_backward(op, layout, x, dy, dx, tensors, "row_backward");
  }
  // Entries by their own names. LayerNorm over each row; statistics from the
  // binary32 inputs in binary64, or in a narrow format when `low` is enabled
  // (policy.norm_statistics).
  void layer_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                          Tensor& mean, Tensor& rstd, const InternalRounding& low = {});
  void layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                           const InternalRounding& low = {});
  // RMSNorm over each row: y = x * rstd * gamma (numerics_layers.hpp), its
  // statistics as LayerNorm's uncentred; backward writes dx and dgamma.
  void rms_norm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd,
                        const InternalRounding& low = {});
  void rms_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                         Tensor& dgamma, const InternalRounding& low = {});

  // NCHW images <-> rows of patches [batch*out_h*out_w, channels*kernel*kernel].
  void im2col(const Tensor& x, const ConvGeometry& g, Tensor& columns);
  void col2im(const Tensor& columns, const ConvGeometry& g, Tensor& dx);  // accumulates into zeroed dx
  // [batch*h*w, c] <-> [batch, c, h, w].
  void rows_to_nchw(const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w, Tensor& nchw);
  void nchw_to_rows(const Tensor& nchw, Tensor& rows);
  void max_pool_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax);
  void max_pool_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx);

  // Transformers (numerics_attention.hpp's arithmetic and layouts).
  void add(Tensor& x, const Tensor& y);  // x += y, element by element (a residual connection)
  // Multi-head attention on the rows of one Linear's [q | k | v] output:
  // scores = mask(q k^T * scale) per sample and head, out = probs v, and
  // their backward passes; each backward writes its parts of dqkv (q and k,
  // or v) and leaves the other columns as they were.
  void attention_scores(const Tensor& qkv, const AttentionShape& shape, Tensor& scores);
  void attention_values(const Tensor& probs, const Tensor& qkv, const AttentionShape& shape, Tensor& out);
  void attention_values_backward(const Tensor& probs, const Tensor& qkv, const Tensor& dout,
                                 const AttentionShape& shape, Tensor& dprobs, Tensor& dqkv);
  void attention_scores_backward(const Tensor& dscores, const Tensor& qkv, const AttentionShape& shape,
                                 Tensor& dqkv);
  // Fused attention (numerics_attention.hpp's fused_attention_row): out as
  // attention_values lays it out; lse and logit_max one value per score row.
  void fused_attention_forward(const Tensor& qkv, const AttentionShape& shape, const FusedAttention& fused,
                               Tensor& out, Tensor& lse, Tensor& logit_max);
  // Its backward's own pieces (the products are attention_values_backward's
  // and attention_scores_backward's): probs = exp(scores - lse) row by row
  // (masked entries 0), dot = sum_c dout o per score row, and
  // dscores = probs (dprobs - dot) (dscores may be dprobs).
  void fused_attention_probs(const Tensor& scores, const Tensor& lse, Tensor& probs);
  void fused_attention_row_dot(const Tensor& dout, const Tensor& out, const AttentionShape& shape, Tensor& dot);
  void fused_attention_scores_grad(const Tensor& probs, const Tensor& dprobs, const Tensor& dot, Tensor& dscores);
  // QK-LayerNorm on [q | k | v] rows (numerics_attention.hpp): y holds the
  // normalised q and k and v unchanged; mean and rstd one value per (row,
  // q or k, head); gamma, beta, dgamma, dbeta 2 x head_dim values. Backward
  // writes dx whole (v's part is dy's).
  void qk_norm_forward(const Tensor& qkv, const Tensor& gamma, const Tensor& beta, const AttentionShape& shape,
                       float eps, Tensor& y, Tensor& mean, Tensor& rstd, const InternalRounding& low = {});
  void qk_norm_backward(const Tensor& qkv, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dy, const AttentionShape& shape, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                        const InternalRounding& low = {});
  // Softmax over each row, and its backward from the probabilities; in a
  // narrow format when `low` is enabled (policy.softmax_internals).
  void softmax_forward(const Tensor& x, Tensor& probs, const InternalRounding& low = {});
  void softmax_backward(const Tensor& probs, const Tensor& dprobs, Tensor& dx, const InternalRounding& low = {});
  // Rotary position embeddings on [q | k | v] rows (numerics_attention.hpp's
  // rotary_value): y holds q and k turned by their positions' angles (by
  // minus them with angles.inverse, the backward), v copied. `table` holds
  // 2 x tokens x head_dim / 2 values (rotary_table).
  void rotary(const Tensor& qkv, const Tensor& table, const AttentionShape& shape, bool inverse, Tensor& y);
  // Dropout with a counter-based mask (numerics_layers.hpp's dropout_value):
  // y_i = x_i / (1 - p) where element i keeps, else 0; the backward is the same call on dy.
  void dropout(const Tensor& x, const DropoutMask& mask, Tensor& y) {
    pointwise_forward(dropout_call(mask), x, y, "dropout");
  }
  // Logit soft-capping, element by element (numerics_attention.hpp's soft_cap):
  // y = cap tanh(x / cap) (-inf kept with keep_mask), and dx = dy (1 - (y / cap)^2) from the capped y.
  void soft_cap_forward(const Tensor& x, float cap, bool keep_mask, Tensor& y) {
    pointwise_forward(soft_cap_call(cap, keep_mask), x, y, "soft_cap_forward");
  }
  void soft_cap_backward(const Tensor& y, const Tensor& dy, float cap, Tensor& dx) {
    pointwise_backward(soft_cap_call(cap, false), y, dy, dx, "soft_cap_backward");
  }
  // The mean over each sample's tokens: x [batch * tokens, width] -> y [batch, width].
  void sequence_mean_forward(const Tensor& x, std::int64_t tokens, Tensor& y);
  void sequence_mean_backward(const Tensor& dy, std::int64_t tokens, Tensor& dx);
  // Token embeddings: out[t, :] = table[ids[t], :] (ids as binary32; an id
  // outside the table gives a NaN row), and the table's gradient, written
  // whole (numerics_attention.hpp's embedding_grad).
  void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);

  // Fused, stable softmax cross-entropy over rows. labels hold class indices
  // as binary32. d_logits = (softmax - onehot) * (grad_scale / batch).
  LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale, Tensor& d_logits);

  // Delayed scaling (Transformer Engine) kept by the backend. `history` is a
  // backend tensor of DelayedScaling::history + 1 values, zeros at first: a
  // ring of the amax of earlier uses and the ring's next position. Rounds t
  // with the scale delayed_scale (numerics.hpp) computes from the ring's
  // largest amax, then, when `record`, writes t's amax into the ring.
  void round_delayed(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                     StochasticStream stream, TensorStats* stats);

  // --- The training step (Op::training_step) ------------------------------------------------------------------
  // A step's loss, its inf/NaN check, the loss scaler (numerics.hpp) and
  // the decision to skip stay where the backend computes (device memory on a
  // GPU), so that a step never waits for them: the trainer reads them with
  // take_steps when it logs. In a step: step_loss, step_check_gradient per
  // gradient, end_step, then per parameter optimizer_step and round_state.

  // Starts the loss scaler afresh; forgets steps not taken and the
  // optimiser's step count. `loss` says what the backward pass differentiates;
  // `loss_low`, enabled, computes its softmax cross-entropy in a narrow format
  // (policy.loss_internals; numerics_layers.hpp).
  void start_steps(const LossScaling& scaling, const LossDefinition& loss, const InternalRounding& loss_low = {});
  // softmax_cross_entropy, but with d_logits' factor loss_gradient_factor(the
  // scaler's current scale, loss, rows); the step keeps the loss and the count.
  void step_loss(const Tensor& logits, const Tensor& labels, Tensor& d_logits);
  // Adds sum_squares(grad) to the step's.
  void step_check_gradient(const Tensor& grad);
  // Decides the step: found_inf when the loss or the gradients' sum of
  // squares is not finite; updates the scaler; records the step.
  void end_step();
  // Unless the step found inf or NaN: unscales grad by the step's scale (one
  // binary32 multiplication by 1/scale, GradScaler.unscale_), computes the
  // update (SGD: state1 is the momentum; Adam/AdamW: state1 and state2 are m
  // and v; t counts the steps that ran) with numerics.hpp's rules, after
  // clipping the unscaled gradient when params.clip_norm > 0, and adds
  // it to the weight, rounded to `storage` (binary32 addition when storage
  // is binary32), counting into stats the updates' histogram and the
  // swallowed updates. grad's values afterwards are unspecified.
  void optimizer_step(const OptimizerParams& params, Tensor& weight, Tensor& grad, Tensor& state1, Tensor& state2,
                      Tensor& update, const RoundingPoint& storage, StochasticStream stream, TensorStats* stats);
  // Rounds optimiser state at `point` (delayed-scaled through `history` when
  // not null), unless the step found inf or NaN: a skipped step leaves it.
  void round_state(Tensor& state, const RoundingPoint& point, Tensor* history, int margin, StochasticStream stream);
  // The steps ended since the last call, in order. Waits for the device.
  std::vector<StepScalars> take_steps();

 protected:
  // The implementations, one per entry of MPSIM_BACKEND_IMPLEMENTATIONS:
  // called only after the checks above.
#define MPSIM_DECLARE_IMPLEMENTATION(result, op, parameters, arguments) virtual result op##_impl parameters = 0;
  MPSIM_BACKEND_IMPLEMENTATIONS(MPSIM_DECLARE_IMPLEMENTATION)
#undef MPSIM_DECLARE_IMPLEMENTATION

  // The optimiser's internals, which optimizer_step runs; not part of the
  // public surface. BackendInternals (tests/support) reaches them so that the
  // backends can be compared op by op.
  // SGD (PyTorch): g' = g + wd*w; m = momentum*m + g' (m = g' at the first step); u = -lr*m.
  virtual void sgd_update(const Tensor& weight, const Tensor& grad, Tensor& momentum, float lr, float momentum_factor,
                          float weight_decay, bool first_step, Tensor& update) = 0;
  // Adam / AdamW (PyTorch formulas).
  virtual void adam_update(const Tensor& weight, const Tensor& grad, Tensor& m, Tensor& v, const AdamParams& p,
                           Tensor& update) = 0;
  // weight <- weight + update, rounded to `storage` (binary32 addition when
  // storage is binary32). Counts into stats the updates' histogram and the
  // swallowed updates (nonzero update, unchanged weight).
  virtual void apply_update(Tensor& weight, const Tensor& update, const RoundingPoint& storage,
                            StochasticStream stream, TensorStats* stats) = 0;
  friend class BackendInternals;

 private:
  // Throws BackendError unless supports(op).
  void require_support(Op op, std::string_view call) const;
  // supports(op), and `supported` for this entry of op's table (named `entry`).
  void require_entry(Op op, bool supported, std::string_view entry, std::string_view call) const;
  // Op::pointwise and this entry.
  void require_pointwise(std::size_t entry, std::string_view call) const;
  // The element-wise calls' checks, naming the public call that was made.
  void pointwise_forward(const PointwiseCall& op, const Tensor& x, Tensor& y, std::string_view call);
  void pointwise_backward(const PointwiseCall& op, const Tensor& saved, const Tensor& dy, Tensor& dx,
                          std::string_view call);
  // The row-wise calls' checks, naming the public call that was made.
  void require_row(const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& y,
                   const RowTensors& tensors, bool backward, std::string_view call) const;
  void row_forward(const RowCall& op, const RowLayout& layout, const Tensor& x, Tensor& y, const RowTensors& tensors,
                   std::string_view call);
  void row_backward(const RowCall& op, const RowLayout& layout, const Tensor& x, const Tensor& dy, Tensor& dx,
                    const RowTensors& tensors, std::string_view call);
  // Throws BackendError unless t holds binary32 values on this backend's device.
  void require_tensor(const Tensor& t, std::string_view call, std::string_view argument) const;
  // Throws BackendError naming the call when ok is false.
  void require_shape(bool ok, std::string_view call, std::string_view what) const;
  // Op::attention, a valid shape, and each tensor sized as qkv, as scores or as the output.
  void require_attention(const AttentionShape& shape, std::string_view call,
                         std::initializer_list<std::pair<const Tensor*, const char*>> qkv_sized,
                         std::initializer_list<std::pair<const Tensor*, const char*>> score_sized,
                         std::initializer_list<std::pair<const Tensor*, const char*>> output_sized) const;
};

std::unique_ptr<Backend> make_cpu_backend();

// Backends by name: "cpu" always; others (gpu/'s "cuda") register themselves
// when their library is linked in. make_backend returns null for an unknown name.
using BackendFactory = std::unique_ptr<Backend> (*)();
void register_backend(std::string_view name, BackendFactory factory);
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string> backend_names();

}  // namespace mpsim::core
