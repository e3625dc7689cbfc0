// The row-wise table (numerics_rows.hpp), bit for bit the CPU backend's: a
// thread per segment runs the rule's statistics (and its backward's) serially,
// as the CPU's loop does; a thread per element runs its element rule; a
// thread per parameter index sums its terms over the segments that use it, in
// binary32 from 0 in increasing segment order (the CPU's order; -fmad=false
// keeps every product and sum rounded on its own, kernels.hpp). Segments are
// features wide (tens to hundreds): a thread per segment is cheap at that size.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

struct RowPointers {
  const float* parameters[2];
  float* statistics[2];
  __device__ core::RowParameters at(std::int64_t offset) const {
    return {{parameters[0] ? parameters[0] + offset : nullptr, parameters[1] ? parameters[1] + offset : nullptr}};
  }
};

template <typename R>
__global__ void row_statistics_kernel(const float* x, core::RowLayout L, RowPointers w, typename R::Params p) {
  for (std::int64_t t = thread_index(); t < L.segments; t += thread_count())
    R::store(R::statistics(x + L.offset(t), L.cols, p), w.statistics, t);
}

template <typename R>
__global__ void row_value_kernel(const float* x, core::RowLayout L, RowPointers w, typename R::Params p, float* y) {
  const std::int64_t total = L.segments * L.cols;
  for (std::int64_t e = thread_index(); e < total; e += thread_count()) {
    const std::int64_t t = e / L.cols, j = e % L.cols, at = L.offset(t) + j;
    y[at] = R::value(x[at], j, R::load(w.statistics, t), w.at(L.param_offset(t)), p);
  }
}

template <typename R>
__global__ void row_grad_statistics_kernel(const float* x, const float* dy, core::RowLayout L, RowPointers w,
                                           typename R::Params p, typename R::GradStats* grad_stats) {
  for (std::int64_t t = thread_index(); t < L.segments; t += thread_count()) {
    const std::int64_t o = L.offset(t);
    grad_stats[t] = R::grad_statistics(x + o, dy + o, L.cols, R::load(w.statistics, t), w.at(L.param_offset(t)), p);
  }
}

template <typename R>
__global__ void row_grad_kernel(const float* x, const float* dy, core::RowLayout L, RowPointers w,
                                typename R::Params p, const typename R::GradStats* grad_stats, float* dx) {
  const std::int64_t total = L.segments * L.cols;
  for (std::int64_t e = thread_index(); e < total; e += thread_count()) {
    const std::int64_t t = e / L.cols, j = e % L.cols, at = L.offset(t) + j;
    dx[at] = R::grad(x[at], dy[at], j, R::load(w.statistics, t), grad_stats[t], w.at(L.param_offset(t)), p);
  }
}

// Parameter index i (block b, feature j): the segments k of each group with
// k / shared_by == b, groups and segments in increasing order.
template <typename R>
__global__ void row_parameter_grad_kernel(const float* x, const float* dy, core::RowLayout L, RowPointers w,
                                          float* grad0, float* grad1) {
  for (std::int64_t i = thread_index(); i < L.param_count(); i += thread_count()) {
    const std::int64_t b = i / L.cols, j = i % L.cols;
    float sum0 = 0.0f, sum1 = 0.0f;
    for (std::int64_t g = 0; g < L.groups(); ++g)
      for (std::int64_t k = b * L.shared_by; k < (b + 1) * L.shared_by; ++k) {
        const std::int64_t t = g * L.per_group + k, at = L.offset(t) + j;
        float terms[2];
        R::parameter_terms(x[at], dy[at], R::load(w.statistics, t), terms);
        sum0 += terms[0];
        sum1 += terms[1];
      }
    if (grad0) grad0[i] = sum0;
    if (grad1) grad1[i] = sum1;
  }
}

__global__ void copy_rest_kernel(const float* from, core::RowLayout L, float* to) {
  const std::int64_t total = L.groups() * L.rest_count;
  for (std::int64_t e = thread_index(); e < total; e += thread_count()) {
    const std::int64_t at = e / L.rest_count * L.group_stride + L.rest_offset + e % L.rest_count;
    to[at] = from[at];
  }
}

void copy_rest(const float* from, const core::RowLayout& L, float* to, cudaStream_t stream) {
  const std::int64_t total = L.groups() * L.rest_count;
  if (total <= 0) return;
  copy_rest_kernel<<<blocks(total), threads, 0, stream>>>(from, L, to);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void row_forward(const core::RowCall& op, const core::RowLayout& L, const float* x, float* y,
                 const RowBuffers& buffers, cudaStream_t stream) {
  const RowPointers w{{buffers.parameters[0], buffers.parameters[1]}, {buffers.statistics[0], buffers.statistics[1]}};
  core::Rows::visit(op, [&]<typename R>(R, const typename R::Params& p) {
    if (L.segments <= 0) return;
    row_statistics_kernel<R><<<blocks(L.segments), threads, 0, stream>>>(x, L, w, p);
    MPSIM_CUDA_CHECK_LAUNCH();
    if (L.cols <= 0) return;
    row_value_kernel<R><<<blocks(L.segments * L.cols), threads, 0, stream>>>(x, L, w, p, y);
    MPSIM_CUDA_CHECK_LAUNCH();
  });
  copy_rest(x, L, y, stream);
}

std::int64_t row_grad_scratch_bytes(const core::RowCall& op, const core::RowLayout& L) {
  std::int64_t bytes = 0;
  core::Rows::visit(op, [&]<typename R>(R, const typename R::Params&) {
    bytes = L.segments * static_cast<std::int64_t>(sizeof(typename R::GradStats));
  });
  return bytes;
}

void row_backward(const core::RowCall& op, const core::RowLayout& L, const float* x, const float* dy, float* dx,
                  const RowBuffers& buffers, void* scratch, cudaStream_t stream) {
  const RowPointers w{{buffers.parameters[0], buffers.parameters[1]}, {buffers.statistics[0], buffers.statistics[1]}};
  core::Rows::visit(op, [&]<typename R>(R, const typename R::Params& p) {
    // The parameter gradients first: no segments still writes them (zeros), as the CPU does.
    if (L.param_count() > 0) {
      row_parameter_grad_kernel<R><<<blocks(L.param_count()), threads, 0, stream>>>(
          x, dy, L, w, buffers.parameter_grads[0], buffers.parameter_grads[1]);
      MPSIM_CUDA_CHECK_LAUNCH();
    }
    if (L.segments <= 0 || L.cols <= 0) return;
    auto* grad_stats = static_cast<typename R::GradStats*>(scratch);
    row_grad_statistics_kernel<R><<<blocks(L.segments), threads, 0, stream>>>(x, dy, L, w, p, grad_stats);
    MPSIM_CUDA_CHECK_LAUNCH();
    row_grad_kernel<R><<<blocks(L.segments * L.cols), threads, 0, stream>>>(x, dy, L, w, p, grad_stats, dx);
    MPSIM_CUDA_CHECK_LAUNCH();
  });
  copy_rest(dy, L, dx, stream);
}

}  // namespace mpsim::gpu::kernels
