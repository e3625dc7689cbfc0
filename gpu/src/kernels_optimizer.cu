// The optimiser's update and its application to the weights, bit for bit
// the CPU backend's: PyTorch's SGD and Adam/AdamW formulas as cpu_backend.cpp
// writes them, one correctly rounded binary32 operation at a time, and the
// weight update either a binary32 addition or the exact sum rounded once to
// the storage format (round_binary64.hpp).
#include "kernels.hpp"
#include "launch.hpp"
#include "round_binary64.hpp"

namespace mpsim::gpu::kernels {
namespace {

// The step's gate (kernels.hpp): false when the step skips its optimiser step.
__device__ inline bool step_runs(const StepState* gate) { return gate == nullptr || gate->skip == 0; }

// The gradient as the optimiser reads it: unscaled when the gate says so.
__device__ inline float unscaled(float g, const StepState* gate) {
  return gate != nullptr && gate->unscale ? __fmul_rn(g, gate->inverse_scale) : g;
}

__global__ void sgd_kernel(const float* w, const float* g, float* m, float* u, std::int64_t n, float neg_lr,
                           float momentum_factor, float weight_decay, bool first_step, const StepState* gate) {
  if (!step_runs(gate)) return;
  if (gate) first_step = gate->optimizer_steps == 1;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float gv = unscaled(g[i], gate);
    const float gi = weight_decay != 0.0f ? __fadd_rn(gv, __fmul_rn(weight_decay, w[i])) : gv;
    if (momentum_factor != 0.0f) {
      const float mi = first_step ? gi : __fadd_rn(__fmul_rn(momentum_factor, m[i]), gi);
      m[i] = mi;
      u[i] = __fmul_rn(neg_lr, mi);
    } else {
      u[i] = __fmul_rn(neg_lr, gi);
    }
  }
}

__global__ void adam_kernel(const float* w, const float* g, float* m, float* v, float* u, std::int64_t n,
                            AdamConstants c, const StepState* gate) {
  if (!step_runs(gate)) return;
  if (gate) {
    const long long t = gate->optimizer_steps;
    c.step_size = __fdiv_rn(c.lr, c.bias[2 * t - 2]);
    c.bias2_sqrt = c.bias[2 * t - 1];
  }
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    float gi = unscaled(g[i], gate);
    float decay = 0.0f;
    if (c.weight_decay != 0.0f) {
      if (c.decoupled) decay = __fmul_rn(c.neg_lr_weight_decay, w[i]);
      else gi = __fadd_rn(gi, __fmul_rn(c.weight_decay, w[i]));
    }
    const float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, gi));
    const float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias2_sqrt), c.eps);
    u[i] = __fsub_rn(decay, __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
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

// A nonzero update that leaves the weight unchanged is swallowed.
__device__ inline unsigned int swallowed(float update, float before, float after) {
  return update != 0.0f && after == before ? 1u : 0u;
}

__global__ void apply_binary32_kernel(float* w, const float* u, std::int64_t n, unsigned long long* counters,
                                      const StepState* gate) {
  if (!step_runs(gate)) return;
  unsigned int local[update_counter_count] = {};
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float before = w[i], next = __fadd_rn(before, u[i]);
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
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float before = w[i], ui = u[i];
    const double sum = add_round_to_odd(static_cast<double>(before), static_cast<double>(ui));
    const std::uint64_t index = draws.first_index + static_cast<std::uint64_t>(i);
    const std::uint32_t draw = stochastic ? device_random_draw(draws.key_low, draws.key_high, index) : 0u;
    const RoundedFloat r = round_double(sum, format, rounding, draw);
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
                cudaStream_t stream) {
  if (n <= 0) return;
  // -lr * m as the CPU writes it: the negation is exact, then one rounding.
  sgd_kernel<<<blocks(n), threads, 0, stream>>>(weight, grad, momentum, update, n, -lr, momentum_factor, weight_decay,
                                                first_step, gate);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void adam_update(const float* weight, const float* grad, float* m, float* v, float* update, std::int64_t n,
                 const AdamConstants& c, const StepState* gate, cudaStream_t stream) {
  if (n <= 0) return;
  adam_kernel<<<blocks(n), threads, 0, stream>>>(weight, grad, m, v, update, n, c, gate);
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
