// Layout kernels: im2col / col2im, rows <-> NCHW, max pooling. Permutations
// and comparisons are exact; col2im and the pooling gradient add in binary32
// in the CPU backend's order (each output element gathers its contributions
// in that order, or one thread walks a plane as the CPU does), so that they
// give its bits without atomics.
#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

// columns[(b, i, j), (c, p, q)] = x[b, c, i*stride - padding + p, j*stride - padding + q], 0 outside.
__global__ void im2col_kernel(const float* x, Geometry g, float* columns) {
  const std::int64_t kk = g.kernel * g.kernel, width = g.channels * kk;
  const std::int64_t total = g.batch * g.out_height * g.out_width * width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t col = t % width, patch = t / width;
    const std::int64_t j = patch % g.out_width, i = patch / g.out_width % g.out_height;
    const std::int64_t b = patch / (g.out_width * g.out_height);
    const std::int64_t c = col / kk, p = col % kk / g.kernel, q = col % g.kernel;
    const std::int64_t y = i * g.stride - g.padding + p, xx = j * g.stride - g.padding + q;
    const bool inside = y >= 0 && y < g.height && xx >= 0 && xx < g.width;
    columns[t] = inside ? x[((b * g.channels + c) * g.height + y) * g.width + xx] : 0.0f;
  }
}

// The CPU loops over patches (b, i, j) and adds each patch's entries into dx;
// the patches that touch dx[b, c, y, x] come in increasing (i, j), one entry
// each. Here each dx element adds exactly those, in that order.
__global__ void col2im_kernel(const float* columns, Geometry g, float* dx) {
  const std::int64_t kk = g.kernel * g.kernel, width = g.channels * kk;
  const std::int64_t total = g.batch * g.channels * g.height * g.width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t xx = t % g.width, y = t / g.width % g.height;
    const std::int64_t c = t / (g.width * g.height) % g.channels, b = t / (g.width * g.height * g.channels);
    // Patch rows i with 0 <= y + padding - i*stride < kernel, likewise columns j.
    const std::int64_t ys = y + g.padding, xs = xx + g.padding;
    const std::int64_t i_first = ys - g.kernel + 1 <= 0 ? 0 : (ys - g.kernel + 1 + g.stride - 1) / g.stride;
    const std::int64_t i_last = min(g.out_height - 1, ys / g.stride);
    const std::int64_t j_first = xs - g.kernel + 1 <= 0 ? 0 : (xs - g.kernel + 1 + g.stride - 1) / g.stride;
    const std::int64_t j_last = min(g.out_width - 1, xs / g.stride);
    float sum = dx[t];
    for (std::int64_t i = i_first; i <= i_last; ++i)
      for (std::int64_t j = j_first; j <= j_last; ++j) {
        const std::int64_t p = ys - i * g.stride, q = xs - j * g.stride;
        sum = __fadd_rn(sum, columns[((b * g.out_height + i) * g.out_width + j) * width + c * kk + p * g.kernel + q]);
      }
    dx[t] = sum;
  }
}

// nchw[b, ch, p] = rows[b*hw + p, ch]
__global__ void rows_to_nchw_kernel(const float* rows, std::int64_t batch, std::int64_t channels, std::int64_t hw,
                                    float* nchw) {
  const std::int64_t total = batch * channels * hw;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t p = t % hw, ch = t / hw % channels, b = t / (hw * channels);
    nchw[t] = rows[(b * hw + p) * channels + ch];
  }
}

__global__ void nchw_to_rows_kernel(const float* nchw, std::int64_t batch, std::int64_t channels, std::int64_t hw,
                                    float* rows) {
  const std::int64_t total = batch * channels * hw;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t ch = t % channels, p = t / channels % hw, b = t / (channels * hw);
    rows[t] = nchw[(b * channels + ch) * hw + p];
  }
}

// The CPU's scan: the first valid element, then any larger one; the first NaN wins and ends the scan.
__global__ void max_pool_forward_kernel(const float* x, Geometry g, float* y, float* argmax) {
  const std::int64_t total = g.batch * g.channels * g.out_height * g.out_width;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t j = t % g.out_width, i = t / g.out_width % g.out_height;
    const std::int64_t plane = t / (g.out_width * g.out_height);
    const float* in = x + plane * g.height * g.width;
    float best = -INFINITY;
    std::int64_t best_index = -1;
    bool found_nan = false;
    for (std::int64_t p = 0; p < g.kernel && !found_nan; ++p)
      for (std::int64_t q = 0; q < g.kernel && !found_nan; ++q) {
        const std::int64_t yy = i * g.stride - g.padding + p, xx = j * g.stride - g.padding + q;
        if (yy < 0 || yy >= g.height || xx < 0 || xx >= g.width) continue;
        const std::int64_t index = yy * g.width + xx;
        const float v = in[index];
        const bool is_nan = v != v;
        if (best_index < 0 || v > best || is_nan) {
          best = v;
          best_index = index;
          found_nan = is_nan;
        }
      }
    y[t] = best;
    argmax[t] = static_cast<float>(best_index);  // an index within the plane: exact below 2^24
  }
}

// One thread per plane, walking its outputs in order: overlapping windows add
// into the same input element in the CPU's order.
__global__ void max_pool_backward_kernel(const float* dy, const float* argmax, std::int64_t planes, std::int64_t in_hw,
                                         std::int64_t out_hw, float* dx) {
  for (std::int64_t plane = thread_index(); plane < planes; plane += thread_count()) {
    float* gx = dx + plane * in_hw;
    for (std::int64_t p = 0; p < in_hw; ++p) gx[p] = 0.0f;
    for (std::int64_t p = 0; p < out_hw; ++p) {
      const auto index = static_cast<std::int64_t>(argmax[plane * out_hw + p]);
      if (index >= 0 && index < in_hw) gx[index] = __fadd_rn(gx[index], dy[plane * out_hw + p]);
    }
  }
}

}  // namespace

void im2col(const float* x, const Geometry& d, float* columns, cudaStream_t stream) {
  const std::int64_t total = d.batch * d.out_height * d.out_width * d.channels * d.kernel * d.kernel;
  if (total <= 0) return;
  im2col_kernel<<<blocks(total), threads, 0, stream>>>(x, d, columns);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void col2im(const float* columns, const Geometry& d, float* dx, cudaStream_t stream) {
  const std::int64_t total = d.batch * d.channels * d.height * d.width;
  if (total <= 0 || d.out_height <= 0 || d.out_width <= 0) return;
  col2im_kernel<<<blocks(total), threads, 0, stream>>>(columns, d, dx);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void rows_to_nchw(const float* rows, std::int64_t batch, std::int64_t channels, std::int64_t hw, float* nchw,
                  cudaStream_t stream) {
  const std::int64_t total = batch * channels * hw;
  if (total <= 0) return;
  rows_to_nchw_kernel<<<blocks(total), threads, 0, stream>>>(rows, batch, channels, hw, nchw);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void nchw_to_rows(const float* nchw, std::int64_t batch, std::int64_t channels, std::int64_t hw, float* rows,
                  cudaStream_t stream) {
  const std::int64_t total = batch * channels * hw;
  if (total <= 0) return;
  nchw_to_rows_kernel<<<blocks(total), threads, 0, stream>>>(nchw, batch, channels, hw, rows);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void max_pool_forward(const float* x, const Geometry& d, float* y, float* argmax, cudaStream_t stream) {
  const std::int64_t total = d.batch * d.channels * d.out_height * d.out_width;
  if (total <= 0) return;
  max_pool_forward_kernel<<<blocks(total), threads, 0, stream>>>(x, d, y, argmax);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void max_pool_backward(const float* dy, const float* argmax, std::int64_t planes, std::int64_t in_hw,
                       std::int64_t out_hw, float* dx, cudaStream_t stream) {
  if (planes <= 0 || in_hw <= 0) return;
  max_pool_backward_kernel<<<blocks(planes), threads, 0, stream>>>(dy, argmax, planes, in_hw, out_hw, dx);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
