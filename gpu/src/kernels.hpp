#pragma once
// The CUDA backend's kernels, one launcher per op (cuda_backend.cu calls
// them). Each enqueues its work on the given stream and checks the launch;
// none synchronises. Pointers are device memory, sizes are element counts.
//
// Bits: where the CPU backend's result is reproducible, the kernels do its
// binary32 and binary64 operations in its order, one correctly rounded
// operation each. The per-element and per-row rules are core's host/device
// functions (numerics.hpp, numerics_layers.hpp), the very code the CPU backend
// runs; what remains here is written with the _rn intrinsics. Both rely on
// gpu/CMakeLists.txt's -fmad=false (nvcc would otherwise contract a*b + c into
// one FMA, one rounding instead of two), -ftz=false, -prec-div=true and
// -prec-sqrt=true (no --use_fast_math). Sums whose CPU order is not reproducible here (Eigen's column
// sums, OpenBLAS) and the libm functions (erf, exp, log) differ from the CPU
// within the bounds tests/gpu/test_backend_ops.cpp states.
#include <cstdint>

#include "check.hpp"
#include "mpsim/core/numerics.hpp"
#include "mpsim/core/numerics_attention.hpp"
#include "mpsim/core/numerics_layers.hpp"
#include "mpsim/core/numerics_ops.hpp"
#include "mpsim/core/numerics_rows.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu::kernels {

inline constexpr unsigned threads = 256;  // a multiple of the warp size

// Grid size of a grid-stride loop over n elements (at most 4096 blocks).
inline unsigned blocks(std::int64_t n) { return detail::blocks_for(static_cast<std::size_t>(n), threads); }

#ifdef __CUDACC__
// Grid-stride loops run over int64 indices: tensors may exceed 2^31 elements.
__device__ inline std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t thread_count() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }
#endif

// The stochastic stream of one call: element i (or step i of the GEMM below)
// draws device_random_draw(key_low, key_high, first_index + i).
struct Draws {
  std::uint32_t key_low = 0, key_high = 0;
  std::uint64_t first_index = 0;
};

// --- Element-wise -------------------------------------------------------------
// Any op of the element-wise table (numerics_ops.hpp): one templated kernel
// per direction, instantiated for every entry. `saved` is null when the entry saves nothing.
void pointwise_forward(const core::PointwiseCall& op, const float* x, float* y, std::int64_t n, cudaStream_t stream);
void pointwise_backward(const core::PointwiseCall& op, const float* saved, const float* dy, float* dx, std::int64_t n,
                        cudaStream_t stream);
// A gated linear unit over rows of [a | b] (2n values) -> n values, and back.
void gated_activation_forward(core::Activation kind, const float* x, float* y, std::int64_t rows, std::int64_t n,
                              cudaStream_t stream);
void gated_activation_backward(core::Activation kind, const float* x, const float* dy, float* dx, std::int64_t rows,
                               std::int64_t n, cudaStream_t stream);
void scale(float* x, std::int64_t n, float factor, cudaStream_t stream);
void add_row_vector(float* x, const float* row, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// --- Transformers (kernels_attention.cu: numerics_attention.hpp's rules) -------
void add(float* x, const float* y, std::int64_t n, cudaStream_t stream);
void attention_scores(const float* qkv, const core::AttentionShape& s, float* scores, cudaStream_t stream);
void attention_values(const float* probs, const float* qkv, const core::AttentionShape& s, float* out,
                      cudaStream_t stream);
void attention_values_backward(const float* probs, const float* qkv, const float* dout, const core::AttentionShape& s,
                               float* dprobs, float* dqkv, cudaStream_t stream);
void attention_scores_backward(const float* dscores, const float* qkv, const core::AttentionShape& s, float* dqkv,
                               cudaStream_t stream);
// Fused attention (numerics_attention.hpp's fused_attention_row and its backward's pieces).
void fused_attention_forward(const float* qkv, const core::AttentionShape& s, const core::FusedAttention& fused,
                             float* out, float* lse, float* logit_max, cudaStream_t stream);
void fused_attention_probs(const float* scores, const float* lse, std::int64_t rows, std::int64_t cols, float* probs,
                           cudaStream_t stream);
void fused_attention_row_dot(const float* dout, const float* out, const core::AttentionShape& s, float* dot,
                             cudaStream_t stream);
void fused_attention_scores_grad(const float* probs, const float* dprobs, const float* dot, std::int64_t rows,
                                 std::int64_t cols, float* dscores, cudaStream_t stream);
// Causal shapes: every entry whose key comes after its query set to `value` (-inf logits, zero gradients).
void attention_mask(float* scores, const core::AttentionShape& s, float value, cudaStream_t stream);
void softmax_forward(const float* x, std::int64_t rows, std::int64_t cols, float* probs,
                     const core::InternalRounding& low, cudaStream_t stream);
void softmax_backward(const float* probs, const float* dprobs, std::int64_t rows, std::int64_t cols, float* dx,
                      const core::InternalRounding& low, cudaStream_t stream);
void rotary(const float* qkv, const float* table, const core::AttentionShape& s, bool inverse, float* y,
            cudaStream_t stream);
void sequence_mean_forward(const float* x, std::int64_t tokens, std::int64_t samples, std::int64_t width, float* y,
                           cudaStream_t stream);
void sequence_mean_backward(const float* dy, std::int64_t tokens, std::int64_t rows, std::int64_t width, float* dx,
                            cudaStream_t stream);
void embedding_forward(const float* ids, const float* table, std::int64_t tokens, std::int64_t rows,
                       std::int64_t width, float* out, cudaStream_t stream);
void embedding_backward(const float* ids, const float* dout, std::int64_t tokens, std::int64_t rows,
                        std::int64_t width, float* dtable, cudaStream_t stream);

// --- Reductions ---------------------------------------------------------------
// sums[j] = sum_i x[i, j] in binary32: partial sums over chunks of rows, then
// the chunks' sums in order. Deterministic. scratch holds
// column_sums_scratch(rows, cols) floats.
std::int64_t column_sums_scratch(std::int64_t rows, std::int64_t cols);
void column_sums(const float* x, std::int64_t rows, std::int64_t cols, float* sums, float* scratch,
                 cudaStream_t stream);
// *result = sum x[i]^2 in binary64 (products exact), in a fixed order for a
// given n: deterministic. partial holds sum_squares_blocks doubles.
inline constexpr unsigned sum_squares_blocks = 512;
void sum_squares(const float* x, std::int64_t n, double* partial, double* result, cudaStream_t stream);
// *result = the bits of the largest finite |x[i]| (0 when none).
void max_abs_finite(const float* x, std::int64_t n, std::uint32_t* result, cudaStream_t stream);

// --- Layout ---------------------------------------------------------------------
// core::ConvGeometry with its output size worked out (this header stays free
// of core's headers: nvcc's host pass warns on one of them).
struct Geometry {
  std::int64_t batch, channels, height, width, kernel, stride, padding, out_height, out_width;
};
void im2col(const float* x, const Geometry& g, float* columns, cudaStream_t stream);
// Adds the patches into dx, each element's contributions in the CPU's order.
void col2im(const float* columns, const Geometry& g, float* dx, cudaStream_t stream);
void rows_to_nchw(const float* rows, std::int64_t batch, std::int64_t channels, std::int64_t hw, float* nchw,
                  cudaStream_t stream);
void nchw_to_rows(const float* nchw, std::int64_t batch, std::int64_t channels, std::int64_t hw, float* rows,
                  cudaStream_t stream);
void max_pool_forward(const float* x, const Geometry& g, float* y, float* argmax, cudaStream_t stream);
// dx = 0, then dy added at argmax plane by plane, in the CPU's order.
void max_pool_backward(const float* dy, const float* argmax, std::int64_t planes, std::int64_t in_hw,
                       std::int64_t out_hw, float* dx, cudaStream_t stream);

// --- Row-wise ops (kernels_rows.cu: numerics_rows.hpp's table) --------------------
// LayerNorm, RMSNorm and QK-LayerNorm are one rule on their layouts. Null
// where the call has no such tensor (core::Backend::RowTensors).
struct RowBuffers {
  const float* parameters[2];
  float* statistics[2];
  float* parameter_grads[2];
};
void row_forward(const core::RowCall& op, const core::RowLayout& layout, const float* x, float* y,
                 const RowBuffers& buffers, cudaStream_t stream);
// The backward's scratch: the rule's GradStats per segment.
std::int64_t row_grad_scratch_bytes(const core::RowCall& op, const core::RowLayout& layout);
void row_backward(const core::RowCall& op, const core::RowLayout& layout, const float* x, const float* dy, float* dx,
                  const RowBuffers& buffers, void* scratch, cudaStream_t stream);

// --- The training step's scalars (core::Backend's step ops) --------------------------
// They stay on the device: the loss scaler runs core's rule (numerics.hpp)
// in a one-thread kernel, and the optimiser kernels read the decision, so a
// step never waits for the host. The host reads the records when it logs.
struct StepRecord {
  double loss_sum, grad_sum_squares, loss_scale;
  unsigned long long correct;
  int found_inf;
};
struct StepState {
  core::LossScaleState scaler;
  core::LossDefinition loss;  // what the backward pass differentiates
  core::InternalRounding loss_low;  // its softmax cross-entropy's format (policy.loss_internals)
  double loss_sum, grad_sum_squares;  // of the step under way
  unsigned long long correct;
  // The step just decided (step_end): the optimiser kernels' gate.
  float inverse_scale;  // binary32 1/scale, GradScaler.unscale_'s factor
  int unscale;          // scale != 1
  int skip;             // inf or NaN found: no optimiser step
  long long optimizer_steps;  // steps that ran: Adam's t
  // The decided step's sum of squares of the loss-scaled gradients and its
  // loss scale: gradient clipping's norm (core::clip_factor), as the CPU keeps them.
  double last_sum_squares, last_scale;
};
void step_start(StepState* state, const core::LossScaling& scaling, const core::LossDefinition& loss,
                const core::InternalRounding& loss_low, cudaStream_t stream);
// Adds the rows' losses (binary64, in row order, as the CPU) and correct counts.
void step_add_loss(const float* row_results, std::int64_t rows, StepState* state, cudaStream_t stream);
// Adds *value (a sum_squares result) to the step's gradient sum of squares.
void step_add_sum_squares(const double* value, StepState* state, cudaStream_t stream);
// Decides the step and writes its record to *record.
void step_end(StepState* state, const core::LossScaling& scaling, StepRecord* record, cudaStream_t stream);
// Delayed scaling: *scale = delayed_scale(max of ring[0..length), largest, margin) and *amax = 0.
void delayed_scale_from_ring(const float* ring, int length, double largest, int margin, float* scale,
                             unsigned int* amax, const StepState* gate, cudaStream_t stream);
// ring[ring[length]] = the binary32 whose pattern is *amax; the position advances.
void push_amax(float* ring, int length, const unsigned int* amax, const StepState* gate, cudaStream_t stream);

// --- Loss -------------------------------------------------------------------------
// Writes d_logits and, per row, row_results[r] = the row's loss (binary32, as
// the CPU computes it before widening) and row_results[rows + r] = 1 when the
// argmax is the label, else 0. A label outside [0, cols) gives a NaN loss.
// With scale_from, factor is ignored: the gradient's factor is
// core::loss_gradient_factor of the step's loss scale and loss, as the CPU's.
void softmax_cross_entropy(const float* logits, const float* labels, std::int64_t rows, std::int64_t cols,
                           float factor, float* d_logits, float* row_results, const StepState* scale_from,
                           cudaStream_t stream);

// --- Optimiser ----------------------------------------------------------------------
// gate (when not null): the step's decision (StepState). The kernels then do
// nothing on a skipped step, unscale the gradient first (one binary32
// multiplication, fused), and take the first step (SGD) or t (Adam) from it.
// clip_norm > 0: the unscaled gradient times core::clip_factor of the gate's last step (needs a gate).
void sgd_update(const float* weight, const float* grad, float* momentum, float* update, std::int64_t n, float lr,
                float momentum_factor, float weight_decay, bool first_step, const StepState* gate,
                cudaStream_t stream, float clip_norm = 0.0f);
// The per-call constants (core::adam_constants, as the CPU's). With a gate,
// t is the gate's: step_size = lr / bias[2t - 2] and bias2_sqrt =
// bias[2t - 1], a table of core::adam_bias the host computes.
struct AdamConstants {
  core::AdamConstants step;
  float lr;
  const float* bias;
};
void adam_update(const float* weight, const float* grad, float* m, float* v, float* update, std::int64_t n,
                 const AdamConstants& c, const StepState* gate, cudaStream_t stream, float clip_norm = 0.0f);

// counters (when not null): the rounding counters (launch.hpp `counter`),
// then the swallowed updates at swallowed_counter.
inline constexpr int swallowed_counter = 6;
inline constexpr int update_counter_count = 7;
// weight <- weight + update in binary32.
void apply_update_binary32(float* weight, const float* update, std::int64_t n, unsigned long long* counters,
                           const StepState* gate, cudaStream_t stream);
// weight <- round(weight + update): the sum exact (rounded to odd in binary64), one rounding to the format.
void apply_update_rounded(float* weight, const float* update, std::int64_t n, DeviceFormat format,
                          DeviceRounding rounding, Draws draws, unsigned long long* counters, const StepState* gate,
                          cudaStream_t stream);

// --- Narrow storage (device_storage.hpp) ---------------------------------------------
// out[i] = decode_storage(codes[i]) * *descale (the multiplication skipped
// when *descale is 1); codes hold storage_bytes(format) bytes each.
void widen(const void* codes, DeviceFormat format, const float* descale, float* out, std::int64_t n,
           cudaStream_t stream);
// codes[i] = encode_storage(values[i]), *descale = 1, for values that are
// the format's; sets inexact_storage in *flag when one is not (its code
// would decode to another value).
void narrow(const float* values, DeviceFormat format, void* codes, float* descale, std::int64_t n, unsigned int* flag,
            cudaStream_t stream);

// --- GEMM helpers ---------------------------------------------------------------------
// Bits of the inexact-operand flag: which Tensor Core input type met a value it does not hold.
inline constexpr unsigned inexact_binary16 = 1, inexact_bfloat16 = 2, inexact_tf32 = 4;
// ... and the bit of narrow(): a value stored narrow was not its format's.
inline constexpr unsigned inexact_storage = 8;
// out[i] = in[i] as __half (bfloat16 = false) or __nv_bfloat16, rounded to
// nearest-even; sets the type's bit in *flag when a non-NaN value changes.
void convert_for_gemm(const float* in, void* out, std::int64_t n, bool bfloat16, unsigned int* flag,
                      cudaStream_t stream);
// Sets inexact_tf32 in *flag when a finite value has more than TF32's 11 significant bits.
void check_tf32(const float* in, std::int64_t n, unsigned int* flag, cudaStream_t stream);

// c[m x n] = op(a) op(b), row-major, op = transpose when asked; a holds
// a_cols columns as stored, b holds b_cols.
struct GemmShape {
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
  std::int64_t a_cols, b_cols;
};
// acc <- round(acc + a*b) for kk = 0..k-1 (products exact, the sum rounded to
// odd in binary64, then once to the format); step kk of output (i, j) draws
// index first_index + (i*k + kk)*n + j, as the CPU's gemm_rounding_every_addition.
void gemm_rounding_every_addition(const float* a, const float* b, float* c, const GemmShape& shape,
                                  DeviceFormat format, DeviceRounding rounding, Draws draws, cudaStream_t stream);

}  // namespace mpsim::gpu::kernels
