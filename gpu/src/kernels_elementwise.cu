// Element-wise kernels: ReLU, GELU, scaling and the bias row, each element as
// the CPU backend computes it (kernels.hpp: the _rn intrinsics keep every
// binary32 operation a separate, correctly rounded one).
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

__global__ void relu_forward_kernel(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) y[i] = x[i] <= 0.0f ? 0.0f : x[i];  // NaN stays NaN
}

__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

// 0.5f * x * (1.0f + erf(x * sqrt1_2)): CUDA's erff differs from glibc's by a few ulps.
__global__ void gelu_forward_kernel(const float* x, float* y, std::int64_t n, GeluConstants c) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float v = x[i];
    y[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, erff(__fmul_rn(v, c.sqrt1_2))));
  }
}

// dy * (cdf + x * pdf), cdf = 0.5f * (1 + erf(x / sqrt 2)), pdf = exp(-0.5f * x * x) / sqrt(2 pi).
__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, std::int64_t n, GeluConstants c) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const float v = x[i];
    const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(v, c.sqrt1_2))));
    const float pdf = __fmul_rn(c.inv_sqrt_2pi, expf(__fmul_rn(__fmul_rn(-0.5f, v), v)));
    dx[i] = __fmul_rn(dy[i], __fadd_rn(cdf, __fmul_rn(v, pdf)));
  }
}

__global__ void scale_kernel(float* x, std::int64_t n, float factor) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) x[i] = __fmul_rn(x[i], factor);
}

__global__ void add_row_vector_kernel(float* x, const float* row, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) x[i] = __fadd_rn(x[i], row[i % cols]);
}

}  // namespace

void relu_forward(const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  relu_forward_kernel<<<blocks(n), threads, 0, stream>>>(x, y, n);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void relu_backward(const float* x, const float* dy, float* dx, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  relu_backward_kernel<<<blocks(n), threads, 0, stream>>>(x, dy, dx, n);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void gelu_forward(const float* x, float* y, std::int64_t n, GeluConstants c, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_forward_kernel<<<blocks(n), threads, 0, stream>>>(x, y, n, c);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n, GeluConstants c, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_backward_kernel<<<blocks(n), threads, 0, stream>>>(x, dy, dx, n, c);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void scale(float* x, std::int64_t n, float factor, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<blocks(n), threads, 0, stream>>>(x, n, factor);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void add_row_vector(float* x, const float* row, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  add_row_vector_kernel<<<blocks(n), threads, 0, stream>>>(x, row, n, cols);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
