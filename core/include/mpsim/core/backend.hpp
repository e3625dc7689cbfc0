#pragma once
// The operations a training step needs, written once in core against this
// interface. The CPU backend implements them with Eigen and emulation/; the
// GPU backend (gpu/) with cuBLAS and CUDA kernels. No CUDA type appears here.
//
// Every op computes in binary32 unless it says otherwise; rounding to a
// storage format happens only in `round`, `gemm` (when the accumulation
// format is not binary32) and `apply_update`, at the points a Policy names.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/core/policy.hpp"
#include "mpsim/core/stats.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/tensor.hpp"
#include "mpsim/emulation/quantize.hpp"

namespace mpsim::core {

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

// One optimiser step's hyperparameters (PyTorch's names and formulas).
struct OptimizerParams {
  OptimizerKind kind = OptimizerKind::sgd;
  float lr = 0.0f, momentum = 0.0f, weight_decay = 0.0f;  // momentum: SGD only
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;       // Adam and AdamW only
};

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;     // AdamW
  std::int64_t step;  // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual void set_threads(int threads) = 0;

  // Memory.
  virtual Tensor zeros(const Shape& shape) = 0;
  virtual Tensor empty(const Shape& shape) = 0;  // contents unspecified: for outputs an op writes whole
  virtual Tensor from_host(std::span<const float> values, const Shape& shape) = 0;
  virtual void to_host(const Tensor& t, std::span<float> out) = 0;
  virtual void copy(const Tensor& from, Tensor& to) = 0;

  // Rounds t in place to the point's format: x -> round(x * scale) / scale,
  // scale a power of two. When stats is not null, adds the histogram of the
  // values x * scale before rounding and the rounding's counters to it.
  virtual RoundResult round(Tensor& t, const RoundingPoint& point, float scale, StochasticStream stream,
                            TensorStats* stats) = 0;

  // c = op(a) * op(b), op = transpose when asked, as `numerics` says.
  virtual void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
                    const GemmNumerics& numerics, StochasticStream stream) = 0;
  virtual void add_row_vector(Tensor& x, const Tensor& row) = 0;    // x[i, :] += row
  virtual void column_sums(const Tensor& x, Tensor& sums) = 0;      // sums[j] = sum_i x[i, j]
  virtual void scale(Tensor& x, float factor) = 0;                  // x *= factor
  virtual double sum_squares(const Tensor& x) = 0;                  // in binary64; inf/NaN propagate

  virtual void relu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // GELU with the exact erf form (PyTorch's default).
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // Normalises each row; statistics in binary32 from the binary32 inputs.
  virtual void layer_norm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                  Tensor& mean, Tensor& rstd) = 0;
  virtual void layer_norm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& dy, Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;

  // NCHW images <-> rows of patches [batch*out_h*out_w, channels*kernel*kernel].
  virtual void im2col(const Tensor& x, const ConvGeometry& g, Tensor& columns) = 0;
  virtual void col2im(const Tensor& columns, const ConvGeometry& g, Tensor& dx) = 0;  // accumulates into zeroed dx
  // [batch*h*w, c] <-> [batch, c, h, w].
  virtual void rows_to_nchw(const Tensor& rows, std::int64_t batch, std::int64_t h, std::int64_t w,
                            Tensor& nchw) = 0;
  virtual void nchw_to_rows(const Tensor& nchw, Tensor& rows) = 0;
  virtual void max_pool_forward(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& argmax) = 0;
  virtual void max_pool_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx) = 0;

  // Fused, stable softmax cross-entropy over rows. labels hold class indices
  // as binary32. d_logits = (softmax - onehot) * (grad_scale / batch).
  virtual LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                           Tensor& d_logits) = 0;

  // Optimiser updates: write the update u (to be added to the weight) in binary32.
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

  // Delayed scaling (Transformer Engine) kept by the backend. `history` is a
  // backend tensor of DelayedScaling::history + 1 values, zeros at first: a
  // ring of the amax of earlier uses and the ring's next position. Rounds t
  // with the scale delayed_scale (numerics.hpp) computes from the ring's
  // largest amax, then, when `record`, writes t's amax into the ring.
  virtual void round_delayed(Tensor& t, const RoundingPoint& point, Tensor& history, int margin, bool record,
                             StochasticStream stream, TensorStats* stats) = 0;

  // --- The training step ---------------------------------------------------------------------------------------
  // A step's loss, its inf/NaN check, the loss scaler (numerics.hpp) and
  // the decision to skip stay where the backend computes (device memory on a
  // GPU), so that a step never waits for them: the trainer reads them with
  // take_steps when it logs. In a step: step_loss, step_check_gradient per
  // gradient, end_step, then per parameter optimizer_step and round_state.

  // Starts the loss scaler afresh; forgets steps not taken and the
  // optimiser's step count. `loss` says what the backward pass differentiates.
  virtual void start_steps(const LossScaling& scaling, const LossDefinition& loss) = 0;
  // softmax_cross_entropy, but with d_logits' factor loss_gradient_factor(the
  // scaler's current scale, loss, rows); the step keeps the loss and the count.
  virtual void step_loss(const Tensor& logits, const Tensor& labels, Tensor& d_logits) = 0;
  // Adds sum_squares(grad) to the step's.
  virtual void step_check_gradient(const Tensor& grad) = 0;
  // Decides the step: found_inf when the loss or the gradients' sum of
  // squares is not finite; updates the scaler; records the step.
  virtual void end_step() = 0;
  // Unless the step found inf or NaN: unscales grad by the step's scale (one
  // binary32 multiplication by 1/scale, GradScaler.unscale_), computes the
  // update as sgd_update or adam_update do (t counts the steps that ran) and
  // applies it as apply_update. grad's values afterwards are unspecified.
  virtual void optimizer_step(const OptimizerParams& params, Tensor& weight, Tensor& grad, Tensor& state1,
                              Tensor& state2, Tensor& update, const RoundingPoint& storage, StochasticStream stream,
                              TensorStats* stats) = 0;
  // Rounds optimiser state at `point` (delayed-scaled through `history` when
  // not null), unless the step found inf or NaN: a skipped step leaves it.
  virtual void round_state(Tensor& state, const RoundingPoint& point, Tensor* history, int margin,
                           StochasticStream stream) = 0;
  // The steps ended since the last call, in order. Waits for the device.
  virtual std::vector<StepScalars> take_steps() = 0;
};

std::unique_ptr<Backend> make_cpu_backend();

// Backends by name: "cpu" always; others (gpu/'s "cuda") register themselves
// when their library is linked in. make_backend returns null for an unknown name.
using BackendFactory = std::unique_ptr<Backend> (*)();
void register_backend(std::string_view name, BackendFactory factory);
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string> backend_names();

}  // namespace mpsim::core
