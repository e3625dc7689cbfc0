// Softmax cross-entropy, a thread per row running numerics_layers.hpp's row
// rule, the CPU backend's loop body; only expf and logf differ from glibc's (CUDA
// documents at most 2 and 1 ulps), so the loss and the gradient agree with
// the CPU within the few-ulp bounds the tests state, and argmax exactly.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

__global__ void softmax_cross_entropy_kernel(const float* logits, const float* labels, std::int64_t rows,
                                             std::int64_t cols, float factor, float* d_logits, float* row_results,
                                             const StepState* scale_from) {
  if (scale_from) factor = core::loss_gradient_factor(scale_from->scaler.scale, scale_from->loss, rows);
  const float z_loss = scale_from ? static_cast<float>(scale_from->loss.z_loss) : 0.0f;  // a training step's only
  const core::InternalRounding low = scale_from ? scale_from->loss_low : core::InternalRounding{};  // likewise
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const core::SoftmaxRow row = core::softmax_cross_entropy_row(logits + r * cols, cols, labels[r], factor,
                                                                 d_logits + r * cols, z_loss, low);
    row_results[r] = row.loss;
    row_results[rows + r] = row.correct ? 1.0f : 0.0f;
  }
}

}  // namespace

void softmax_cross_entropy(const float* logits, const float* labels, std::int64_t rows, std::int64_t cols,
                           float factor, float* d_logits, float* row_results, const StepState* scale_from,
                           cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  softmax_cross_entropy_kernel<<<blocks(rows), threads, 0, stream>>>(logits, labels, rows, cols, factor, d_logits,
                                                                     row_results, scale_from);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
