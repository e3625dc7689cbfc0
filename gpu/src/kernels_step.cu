// The training step's scalars on the device (kernels.hpp, "The training
// step's scalars"): one-thread kernels that run core's rules
// (numerics.hpp) on values that never leave the device, so that the host
// queues a whole step without waiting. Each sum runs in the CPU backend's
// order with one correctly rounded binary64 addition at a time.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

__global__ void start_kernel(StepState* state, core::LossScaling scaling, core::LossDefinition loss,
                             core::InternalRounding loss_low) {
  StepState s{};
  s.scaler = core::initial_loss_scale(scaling);
  s.loss = loss;
  s.loss_low = loss_low;
  s.inverse_scale = 1.0f;
  *state = s;
}

__global__ void add_loss_kernel(const float* row_results, std::int64_t rows, StepState* state) {
  double sum = state->loss_sum;
  unsigned long long correct = state->correct;
  for (std::int64_t r = 0; r < rows; ++r) {
    sum = __dadd_rn(sum, static_cast<double>(row_results[r]));
    correct += row_results[rows + r] != 0.0f;
  }
  state->loss_sum = sum;
  state->correct = correct;
}

__global__ void add_sum_squares_kernel(const double* value, StepState* state) {
  state->grad_sum_squares = __dadd_rn(state->grad_sum_squares, *value);
}

__global__ void end_kernel(StepState* state, core::LossScaling scaling, StepRecord* record) {
  StepState s = *state;
  StepRecord r{};
  r.loss_sum = s.loss_sum;
  r.grad_sum_squares = s.grad_sum_squares;
  r.loss_scale = s.scaler.scale;
  r.correct = s.correct;
  const core::StepDecision decision = core::decide_step(s.scaler, scaling, s.loss_sum, s.grad_sum_squares);
  r.found_inf = decision.found_inf;
  s.last_sum_squares = s.grad_sum_squares;
  s.last_scale = r.loss_scale;  // the step's scale, before decide_step updated the scaler (the CPU's last_scale_)
  s.skip = decision.found_inf;
  s.unscale = decision.unscale;
  s.inverse_scale = decision.inverse_scale;
  if (!r.found_inf) ++s.optimizer_steps;
  s.loss_sum = s.grad_sum_squares = 0.0;
  s.correct = 0;
  *state = s;
  *record = r;
}

__global__ void delayed_scale_kernel(const float* ring, int length, double largest, int margin, float* scale,
                                     unsigned int* amax, const StepState* gate) {
  if (gate && gate->skip) return;
  *scale = core::delayed_scale(core::history_amax(ring, length), largest, margin);
  *amax = 0;
}

__global__ void push_amax_kernel(float* ring, int length, const unsigned int* amax, const StepState* gate) {
  if (gate && gate->skip) return;
  core::push_history(ring, length, __uint_as_float(*amax));
}

}  // namespace

void step_start(StepState* state, const core::LossScaling& scaling, const core::LossDefinition& loss,
                const core::InternalRounding& loss_low, cudaStream_t stream) {
  start_kernel<<<1, 1, 0, stream>>>(state, scaling, loss, loss_low);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void step_add_loss(const float* row_results, std::int64_t rows, StepState* state, cudaStream_t stream) {
  if (rows <= 0) return;
  add_loss_kernel<<<1, 1, 0, stream>>>(row_results, rows, state);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void step_add_sum_squares(const double* value, StepState* state, cudaStream_t stream) {
  add_sum_squares_kernel<<<1, 1, 0, stream>>>(value, state);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void step_end(StepState* state, const core::LossScaling& scaling, StepRecord* record, cudaStream_t stream) {
  end_kernel<<<1, 1, 0, stream>>>(state, scaling, record);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void delayed_scale_from_ring(const float* ring, int length, double largest, int margin, float* scale,
                             unsigned int* amax, const StepState* gate, cudaStream_t stream) {
  delayed_scale_kernel<<<1, 1, 0, stream>>>(ring, length, largest, margin, scale, amax, gate);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void push_amax(float* ring, int length, const unsigned int* amax, const StepState* gate, cudaStream_t stream) {
  push_amax_kernel<<<1, 1, 0, stream>>>(ring, length, amax, gate);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
