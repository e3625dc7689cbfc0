// Element-wise kernels: the element-wise table (numerics_ops.hpp's rules,
// which the CPU backend runs too), the gated units, scaling and the bias row, each element as the
// CPU backend computes it (kernels.hpp: one correctly rounded operation each).
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

// An entry of numerics_ops.hpp's element-wise table, element by element:
// the CPU backend's loop bodies, the parameters by value.
template <typename P>
__global__ void pointwise_forward_kernel(const float* x, float* y, std::int64_t n, typename P::Params p) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) y[i] = P::forward(x[i], p, i);
}
template <typename P>
__global__ void pointwise_backward_kernel(const float* saved, const float* dy, float* dx, std::int64_t n,
                                          typename P::Params p) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count())
    dx[i] = P::backward(P::saves == core::Saves::nothing ? 0.0f : saved[i], dy[i], p, i);
}

// A gated linear unit over rows of [a | b]: the CPU backend's loop bodies.
template <typename A>
__global__ void gated_forward_kernel(const float* x, float* y, std::int64_t rows, std::int64_t n) {
  for (std::int64_t t = thread_index(); t < rows * n; t += thread_count()) {
    const std::int64_t r = t / n, j = t % n;
    y[t] = core::gated_forward<A>(x[r * 2 * n + j], x[r * 2 * n + n + j]);
  }
}
template <typename A>
__global__ void gated_backward_kernel(const float* x, const float* dy, float* dx, std::int64_t rows, std::int64_t n) {
  for (std::int64_t t = thread_index(); t < rows * n; t += thread_count()) {
    const std::int64_t r = t / n, j = t % n;
    const float a = x[r * 2 * n + j], b = x[r * 2 * n + n + j];
    dx[r * 2 * n + j] = core::gated_gate_grad<A>(a, b, dy[t]);
    dx[r * 2 * n + n + j] = core::gated_value_grad<A>(a, dy[t]);
  }
}

__global__ void scale_kernel(float* x, std::int64_t n, float factor) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) x[i] = __fmul_rn(x[i], factor);
}

__global__ void add_row_vector_kernel(float* x, const float* row, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) x[i] = __fadd_rn(x[i], row[i % cols]);
}

}  // namespace

void pointwise_forward(const core::PointwiseCall& op, const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  core::Pointwises::visit(op, [&]<typename P>(P, const typename P::Params& p) {
    pointwise_forward_kernel<P><<<blocks(n), threads, 0, stream>>>(x, y, n, p);
  });
  MPSIM_CUDA_CHECK_LAUNCH();
}

void pointwise_backward(const core::PointwiseCall& op, const float* saved, const float* dy, float* dx, std::int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return;
  core::Pointwises::visit(op, [&]<typename P>(P, const typename P::Params& p) {
    pointwise_backward_kernel<P><<<blocks(n), threads, 0, stream>>>(saved, dy, dx, n, p);
  });
  MPSIM_CUDA_CHECK_LAUNCH();
}

void gated_activation_forward(core::Activation kind, const float* x, float* y, std::int64_t rows, std::int64_t n,
                              cudaStream_t stream) {
  if (rows * n <= 0) return;
  core::Activations::visit(kind, [&]<typename A>(A) {
    gated_forward_kernel<A><<<blocks(rows * n), threads, 0, stream>>>(x, y, rows, n);
  });
  MPSIM_CUDA_CHECK_LAUNCH();
}

void gated_activation_backward(core::Activation kind, const float* x, const float* dy, float* dx, std::int64_t rows,
                               std::int64_t n, cudaStream_t stream) {
  if (rows * n <= 0) return;
  core::Activations::visit(kind, [&]<typename A>(A) {
    gated_backward_kernel<A><<<blocks(rows * n), threads, 0, stream>>>(x, dy, dx, rows, n);
  });
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
