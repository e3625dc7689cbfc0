// LayerNorm, bit for bit the CPU backend's: each row's statistics and
// backward means by one thread running numerics_layers.hpp's row rules (the
// CPU's loop bodies), each column's parameter gradients by one thread over the
// rows in increasing order (binary32, as the CPU's), and every element through
// numerics_layers.hpp's element rules.
// Rows are features wide (hundreds): a thread per row is cheap at that size.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

// RMSNorm runs the same kernels uncentred: mean is null (taken as 0), and
// so are beta and dbeta.
__device__ inline float mean_of(const float* mean, std::int64_t r) { return mean ? mean[r] : 0.0f; }

// A thread per row: numerics_layers.hpp's statistics.
__global__ void layer_norm_statistics(const float* x, float eps, std::int64_t rows, std::int64_t cols, float* mean,
                                      float* rstd, core::InternalRounding low) {
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const core::LayerNormStatistics st = core::layer_norm_statistics(x + r * cols, cols, eps, mean != nullptr, low);
    if (mean) mean[r] = st.mean;
    rstd[r] = st.rstd;
  }
}

// y = (x - mean) * rstd * gamma + beta, in binary32.
__global__ void layer_norm_output(const float* x, const float* gamma, const float* beta, const float* mean,
                                  const float* rstd, std::int64_t rows, std::int64_t cols, float* y) {
  const std::int64_t total = rows * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t r = t / cols, j = t % cols;
    y[t] = beta ? core::layer_norm_output(x[t], mean[r], rstd[r], gamma[j], beta[j])
                : core::rms_norm_output(x[t], rstd[r], gamma[j]);
  }
}

// Per row: the means of dxhat = dy * gamma and of dxhat * xhat (binary64 sums).
__global__ void layer_norm_row_means(const float* x, const float* gamma, const float* mean, const float* rstd,
                                     const float* dy, std::int64_t rows, std::int64_t cols, float* mean_dxhat,
                                     float* mean_dxhat_xhat, core::InternalRounding low) {
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const core::LayerNormRowMeans means = core::layer_norm_row_means(x + r * cols, dy + r * cols, gamma, cols,
                                                                     mean_of(mean, r), rstd[r], mean != nullptr, low);
    mean_dxhat[r] = means.dxhat;
    mean_dxhat_xhat[r] = means.dxhat_xhat;
  }
}

// dx = rstd * (dy * gamma - mean_dxhat - xhat * mean_dxhat_xhat), in binary32.
__global__ void layer_norm_input_grad(const float* x, const float* gamma, const float* mean, const float* rstd,
                                      const float* dy, const float* mean_dxhat, const float* mean_dxhat_xhat,
                                      std::int64_t rows, std::int64_t cols, float* dx) {
  const std::int64_t total = rows * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t r = t / cols, j = t % cols;
    const float xhat = core::layer_norm_xhat(x[t], mean_of(mean, r), rstd[r]);
    dx[t] = core::layer_norm_input_grad(dy[t], gamma[j], xhat, rstd[r], {mean_dxhat[r], mean_dxhat_xhat[r]});
  }
}

// dgamma[j] = sum_r dy * xhat, dbeta[j] = sum_r dy, from 0 in increasing r (binary32).
__global__ void layer_norm_parameter_grads(const float* x, const float* mean, const float* rstd, const float* dy,
                                           std::int64_t rows, std::int64_t cols, float* dgamma, float* dbeta) {
  for (std::int64_t j = thread_index(); j < cols; j += thread_count()) {
    float gg = 0.0f, gb = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float xhat = core::layer_norm_xhat(x[r * cols + j], mean_of(mean, r), rstd[r]);
      gg = __fadd_rn(gg, __fmul_rn(dy[r * cols + j], xhat));
      gb = __fadd_rn(gb, dy[r * cols + j]);
    }
    dgamma[j] = gg;
    if (dbeta) dbeta[j] = gb;
  }
}

}  // namespace

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                        std::int64_t cols, float* y, float* mean, float* rstd, const core::InternalRounding& low,
                        cudaStream_t stream) {
  if (rows <= 0) return;
  layer_norm_statistics<<<blocks(rows), threads, 0, stream>>>(x, eps, rows, cols, mean, rstd, low);
  MPSIM_CUDA_CHECK_LAUNCH();
  if (cols <= 0) return;
  layer_norm_output<<<blocks(rows * cols), threads, 0, stream>>>(x, gamma, beta, mean, rstd, rows, cols, y);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                         std::int64_t rows, std::int64_t cols, float* dx, float* dgamma, float* dbeta, float* scratch,
                         const core::InternalRounding& low, cudaStream_t stream) {
  if (cols <= 0) return;
  if (rows > 0) {
    float *mean_dxhat = scratch, *mean_dxhat_xhat = scratch + rows;
    layer_norm_row_means<<<blocks(rows), threads, 0, stream>>>(x, gamma, mean, rstd, dy, rows, cols, mean_dxhat,
                                                                mean_dxhat_xhat, low);
    MPSIM_CUDA_CHECK_LAUNCH();
    layer_norm_input_grad<<<blocks(rows * cols), threads, 0, stream>>>(x, gamma, mean, rstd, dy, mean_dxhat,
                                                                        mean_dxhat_xhat, rows, cols, dx);
    MPSIM_CUDA_CHECK_LAUNCH();
  }
  layer_norm_parameter_grads<<<blocks(cols), threads, 0, stream>>>(x, mean, rstd, dy, rows, cols, dgamma, dbeta);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void rms_norm_forward(const float* x, const float* gamma, float eps, std::int64_t rows, std::int64_t cols, float* y,
                      float* rstd, const core::InternalRounding& low, cudaStream_t stream) {
  layer_norm_forward(x, gamma, nullptr, eps, rows, cols, y, nullptr, rstd, low, stream);
}

void rms_norm_backward(const float* x, const float* gamma, const float* rstd, const float* dy, std::int64_t rows,
                       std::int64_t cols, float* dx, float* dgamma, float* scratch, const core::InternalRounding& low,
                       cudaStream_t stream) {
  layer_norm_backward(x, gamma, nullptr, rstd, dy, rows, cols, dx, dgamma, nullptr, scratch, low, stream);
}

}  // namespace mpsim::gpu::kernels
