// The optimiser's update and its application to the weights, bit for bit
// the CPU backend's: PyTorch's SGD and Adam/AdamW formulas are
// core/include/mpsim/core/numerics.hpp's, which the CPU backend calls too, and the
// weight update either a binary32 addition or the exact sum rounded once to
// the storage format (round_binary64.hpp).
#include "kernels.hpp"
#include "launch.hpp"
#include "round_binary64.hpp"

namespace mpsim::gpu::kernels {
namespace {

// The step's gate (kernels.hpp): false when the step skips its optimiser step.
__device__ inline bool step_runs(const StepState* gate) { return gate == nullptr || gate->skip == 0; }

// The gradient as the optimiser reads it: unscaled when the gate says so,
// then clipped (`clip` = core::clip_factor, applied when below 1), two
// binary32 multiplications as the CPU's in-place passes.
__device__ inline float unscaled(float g, const StepState* gate, float clip) {
  const float u = gate != nullptr && gate->unscale ? core::unscale(g, gate->inverse_scale) : g;
  return clip < 1.0f ? u * clip : u;
}
__device__ inline float clip_of(const StepState* gate, float clip_norm) {
  return gate != nullptr ? core::clip_factor(gate->last_sum_squares, gate->last_scale, clip_norm) : 1.0f;
}

__global__ void sgd_kernel(const float* w, const float* g, float* m, float* u, std::int64_t n,
                           core::SgdConstants c, const StepState* gate, float clip_norm) {
  if (!step_runs(gate)) return;
  if (gate) c.first_step = gate->optimizer_steps == 1;
  const float clip = clip_of(gate, clip_norm);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    float mi = c.momentum != 0.0f ? m[i] : 0.0f;
    u[i] = core::sgd_update(c, w[i], unscaled(g[i], gate, clip), mi);
    if (c.momentum != 0.0f) m[i] = mi;
  }
}

__global__ void adam_kernel(const float* w, const float* g, float* m, float* v, float* u, std::int64_t n,
                            AdamConstants c, const StepState* gate, float clip_norm) {
  if (!step_runs(gate)) return;
  if (gate) {
    const long long t = gate->optimizer_steps;
    c.step.step_size = c.lr / c.bias[2 * t - 2];
    c.step.bias2_sqrt = c.bias[2 * t - 1];
  }
  const float clip = clip_of(gate, clip_norm);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    float mi = m[i], vi = v[i];
    u[i] = core::adam_update(c.step, w[i], unscaled(g[i], gate, clip), mi, vi);
    m[i] = mi;
    v[i] = vi;
  }
}

// Adds a thread's counts to the block's warps' sums and those to counters.
template <int Count>
__device__ void add_counts(const unsigned int (&local)[Count], unsigned long long* counters) {
  for (int c = 0; c < Count; ++c) {
    const unsigned int warp_sum = __reduce_add_sync(0xffffffffu, local[c]);
    if ((threadIdx.x & 31) == 0 && warp_sum != 0) atomicAdd(&counters[c], static_cast<unsigned long long>(warp_sum));
  }
}

// numerics.hpp's rule, as a count.
__device__ inline unsigned int swallowed(float update, float before, float after) {
  return core::swallowed(update, before, after) ? 1u : 0u;
}

__global__ void apply_binary32_kernel(float* w, const float* u, std::int64_t n, unsigned long long* counters,
                                      const StepState* gate) {
  if (!step_runs(gate)) return;
  unsigned int local[update_counter_count] = {};
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float before = w[i], next = before + u[i];
    local[swallowed_counter] += swallowed(u[i], before, next);
    w[i] = next;
  }
  if (counters) add_counts(local, counters);  // the whole grid takes the same branch
}

__global__ void apply_rounded_kernel(float* w, const float* u, std::int64_t n, DeviceFormat format,
                                     DeviceRounding rounding, Draws draws, unsigned long long* counters,
                                     const StepState* gate) {
  if (!step_runs(gate)) return;
  unsigned int local[update_counter_count] = {};
  const bool stochastic = rounding.mode == device_mode::stochastic;
  const PatternFormat<std::uint64_t> wide = widen_format(format);
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float before = w[i], ui = u[i];
    const double sum = add_round_to_odd(static_cast<double>(before), static_cast<double>(ui));
    const std::uint64_t index = draws.first_index + static_cast<std::uint64_t>(i);
    const std::uint32_t draw = stochastic ? device_random_draw(draws.key_low, draws.key_high, index) : 0u;
    const RoundedFloat r = round_double(sum, wide, rounding, draw);
    local[detail::counter::inexact] += r.inexact;
    local[detail::counter::flushed] += r.flushed_to_zero;
    local[detail::counter::subnormal] += r.subnormal;
    local[detail::counter::overflow] += r.overflow;
    local[detail::counter::nan] += r.nan;
    local[swallowed_counter] += swallowed(ui, before, r.value);
    w[i] = r.value;
  }
  if (counters) add_counts(local, counters);
}

}  // namespace

void sgd_update(const float* weight, const float* grad, float* momentum, float* update, std::int64_t n, float lr,
                float momentum_factor, float weight_decay, bool first_step, const StepState* gate,
                cudaStream_t stream, float clip_norm) {
  if (n <= 0) return;
  sgd_kernel<<<blocks(n), threads, 0, stream>>>(weight, grad, momentum, update, n,
                                                core::SgdConstants{-lr, momentum_factor, weight_decay, first_step},
                                                gate, clip_norm);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void adam_update(const float* weight, const float* grad, float* m, float* v, float* update, std::int64_t n,
                 const AdamConstants& c, const StepState* gate, cudaStream_t stream, float clip_norm) {
  if (n <= 0) return;
  adam_kernel<<<blocks(n), threads, 0, stream>>>(weight, grad, m, v, update, n, c, gate, clip_norm);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void apply_update_binary32(float* weight, const float* update, std::int64_t n, unsigned long long* counters,
                           const StepState* gate, cudaStream_t stream) {
  if (n <= 0) return;
  apply_binary32_kernel<<<blocks(n), threads, 0, stream>>>(weight, update, n, counters, gate);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void apply_update_rounded(float* weight, const float* update, std::int64_t n, DeviceFormat format,
                          DeviceRounding rounding, Draws draws, unsigned long long* counters, const StepState* gate,
                          cudaStream_t stream) {
  if (n <= 0) return;
  apply_rounded_kernel<<<blocks(n), threads, 0, stream>>>(weight, update, n, format, rounding, draws, counters, gate);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
