// Softmax cross-entropy, a thread per row in the CPU backend's order and
// binary32 operations; only expf and logf differ from glibc's (CUDA
// documents at most 2 and 1 ulps), so the loss and the gradient agree with
// the CPU within the few-ulp bounds the tests state, and argmax exactly.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

__global__ void softmax_cross_entropy_kernel(const float* logits, const float* labels, std::int64_t rows,
                                             std::int64_t cols, float factor, float* d_logits, float* row_results,
                                             const StepState* scale_from) {
  if (scale_from) factor = core::loss_gradient_factor(scale_from->scaler.scale, scale_from->loss, rows);
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const float* row = logits + r * cols;
    float* d = d_logits + r * cols;
    const float label_value = labels[r];
    // A label is a class index stored as binary32; anything else gets a NaN loss
    // and no one-hot term (the CPU backend would read outside the row).
    const bool valid = label_value >= 0.0f && label_value < static_cast<float>(cols);
    const std::int64_t label = valid ? static_cast<std::int64_t>(label_value) : -1;
    std::int64_t argmax = 0;
    float max = row[0];
    for (std::int64_t j = 1; j < cols; ++j)
      if (row[j] > max) max = row[j], argmax = j;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < cols; ++j) sum = __fadd_rn(sum, expf(__fsub_rn(row[j], max)));
    const float log_sum = logf(sum);
    row_results[r] = valid ? __fsub_rn(log_sum, __fsub_rn(row[label], max)) : __int_as_float(0x7fc00000);
    row_results[rows + r] = valid && argmax == label ? 1.0f : 0.0f;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float p = expf(__fsub_rn(__fsub_rn(row[j], max), log_sum));
      d[j] = __fmul_rn(__fsub_rn(p, j == label ? 1.0f : 0.0f), factor);
    }
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
