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
};

std::unique_ptr<Backend> make_cpu_backend();

// Backends by name: "cpu" always; others (gpu/'s "cuda") register themselves
// when their library is linked in. make_backend returns null for an unknown name.
using BackendFactory = std::unique_ptr<Backend> (*)();
void register_backend(std::string_view name, BackendFactory factory);
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string> backend_names();

}  // namespace mpsim::core
