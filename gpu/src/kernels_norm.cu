// LayerNorm, bit for bit the CPU backend's: each row's statistics are summed
// by one thread in the CPU's order (binary64), each column's parameter
// gradients by one thread over the rows in order (binary32), and every
// element's arithmetic is the CPU's sequence of correctly rounded operations.
// Rows are features wide (hundreds): a thread per row is cheap at that size.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

// mean = sum x / cols; rstd = 1 / sqrt(sum (x - mean)^2 / cols + eps), in
// binary64 from the binary32 inputs, stored as binary32.
__global__ void layer_norm_statistics(const float* x, float eps, std::int64_t rows, std::int64_t cols, float* mean,
                                      float* rstd) {
  const double count = static_cast<double>(cols);
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const float* row = x + r * cols;
    double s = 0.0, s2 = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) s = __dadd_rn(s, static_cast<double>(row[j]));
    const double m = __ddiv_rn(s, count);
    for (std::int64_t j = 0; j < cols; ++j) {
      const double d = __dsub_rn(static_cast<double>(row[j]), m);
      s2 = __dadd_rn(s2, __dmul_rn(d, d));
    }
    mean[r] = __double2float_rn(m);
    rstd[r] = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(s2, count), static_cast<double>(eps)))));
  }
}

// y = (x - mean) * rstd * gamma + beta, in binary32.
__global__ void layer_norm_output(const float* x, const float* gamma, const float* beta, const float* mean,
                                  const float* rstd, std::int64_t rows, std::int64_t cols, float* y) {
  const std::int64_t total = rows * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t r = t / cols, j = t % cols;
    y[t] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[t], mean[r]), rstd[r]), gamma[j]), beta[j]);
  }
}

// Per row: the means of dxhat = dy * gamma and of dxhat * xhat (binary64 sums).
__global__ void layer_norm_row_means(const float* x, const float* gamma, const float* mean, const float* rstd,
                                     const float* dy, std::int64_t rows, std::int64_t cols, float* mean_dxhat,
                                     float* mean_dxhat_xhat) {
  const double count = static_cast<double>(cols);
  for (std::int64_t r = thread_index(); r < rows; r += thread_count()) {
    const float *row = x + r * cols, *grow = dy + r * cols;
    double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float xhat = __fmul_rn(__fsub_rn(row[j], mean[r]), rstd[r]);
      const float dxhat = __fmul_rn(grow[j], gamma[j]);
      sum_dxhat = __dadd_rn(sum_dxhat, static_cast<double>(dxhat));
      sum_dxhat_xhat = __dadd_rn(sum_dxhat_xhat, __dmul_rn(static_cast<double>(dxhat), static_cast<double>(xhat)));
    }
    mean_dxhat[r] = __double2float_rn(__ddiv_rn(sum_dxhat, count));
    mean_dxhat_xhat[r] = __double2float_rn(__ddiv_rn(sum_dxhat_xhat, count));
  }
}

// dx = rstd * (dy * gamma - mean_dxhat - xhat * mean_dxhat_xhat), in binary32.
__global__ void layer_norm_input_grad(const float* x, const float* gamma, const float* mean, const float* rstd,
                                      const float* dy, const float* mean_dxhat, const float* mean_dxhat_xhat,
                                      std::int64_t rows, std::int64_t cols, float* dx) {
  const std::int64_t total = rows * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t r = t / cols, j = t % cols;
    const float xhat = __fmul_rn(__fsub_rn(x[t], mean[r]), rstd[r]);
    const float centred = __fsub_rn(__fsub_rn(__fmul_rn(dy[t], gamma[j]), mean_dxhat[r]),
                                    __fmul_rn(xhat, mean_dxhat_xhat[r]));
    dx[t] = __fmul_rn(rstd[r], centred);
  }
}

// dgamma[j] = sum_r dy * xhat, dbeta[j] = sum_r dy, from 0 in increasing r (binary32).
__global__ void layer_norm_parameter_grads(const float* x, const float* mean, const float* rstd, const float* dy,
                                           std::int64_t rows, std::int64_t cols, float* dgamma, float* dbeta) {
  for (std::int64_t j = thread_index(); j < cols; j += thread_count()) {
    float gg = 0.0f, gb = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float xhat = __fmul_rn(__fsub_rn(x[r * cols + j], mean[r]), rstd[r]);
      gg = __fadd_rn(gg, __fmul_rn(dy[r * cols + j], xhat));
      gb = __fadd_rn(gb, dy[r * cols + j]);
    }
    dgamma[j] = gg;
    dbeta[j] = gb;
  }
}

}  // namespace

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                        std::int64_t cols, float* y, float* mean, float* rstd, cudaStream_t stream) {
  if (rows <= 0) return;
  layer_norm_statistics<<<blocks(rows), threads, 0, stream>>>(x, eps, rows, cols, mean, rstd);
  MPSIM_CUDA_CHECK_LAUNCH();
  if (cols <= 0) return;
  layer_norm_output<<<blocks(rows * cols), threads, 0, stream>>>(x, gamma, beta, mean, rstd, rows, cols, y);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                         std::int64_t rows, std::int64_t cols, float* dx, float* dgamma, float* dbeta, float* scratch,
                         cudaStream_t stream) {
  if (cols <= 0) return;
  if (rows > 0) {
    float *mean_dxhat = scratch, *mean_dxhat_xhat = scratch + rows;
    layer_norm_row_means<<<blocks(rows), threads, 0, stream>>>(x, gamma, mean, rstd, dy, rows, cols, mean_dxhat,
                                                                mean_dxhat_xhat);
    MPSIM_CUDA_CHECK_LAUNCH();
    layer_norm_input_grad<<<blocks(rows * cols), threads, 0, stream>>>(x, gamma, mean, rstd, dy, mean_dxhat,
                                                                        mean_dxhat_xhat, rows, cols, dx);
    MPSIM_CUDA_CHECK_LAUNCH();
  }
  layer_norm_parameter_grads<<<blocks(cols), threads, 0, stream>>>(x, mean, rstd, dy, rows, cols, dgamma, dbeta);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
