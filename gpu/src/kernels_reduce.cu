// Reductions in a fixed order, so that a GPU run repeats itself bit for bit.
// Their order is not the CPU's (Eigen's column sums, the CPU's sixteen
// binary64 lanes), so the last bits may differ from the CPU backend's.
#include <algorithm>

#include "kernels.hpp"

namespace mpsim::gpu::kernels {
namespace {

constexpr std::int64_t column_chunk = 256;  // rows summed by one thread before the chunks are added

__host__ __device__ inline std::int64_t chunks_of(std::int64_t rows) {
  return (rows + column_chunk - 1) / column_chunk;
}

// Sum of rows [chunk * column_chunk, ...) of column j, starting from the first
// value (as Eigen does: a column of -0 sums to -0), in increasing row order.
__global__ void column_chunk_sums(const float* x, std::int64_t rows, std::int64_t cols, float* out) {
  const std::int64_t total = chunks_of(rows) * cols;
  for (std::int64_t t = thread_index(); t < total; t += thread_count()) {
    const std::int64_t j = t % cols, first = t / cols * column_chunk;
    const std::int64_t last = min(rows, first + column_chunk);
    float sum = x[first * cols + j];
    for (std::int64_t r = first + 1; r < last; ++r) sum = __fadd_rn(sum, x[r * cols + j]);
    out[t] = sum;
  }
}

__global__ void add_chunks(const float* partial, std::int64_t chunks, std::int64_t cols, float* sums) {
  for (std::int64_t j = thread_index(); j < cols; j += thread_count()) {
    float sum = partial[j];
    for (std::int64_t c = 1; c < chunks; ++c) sum = __fadd_rn(sum, partial[c * cols + j]);
    sums[j] = sum;
  }
}

// Each thread sums its grid-stride elements in order, then a fixed tree per block.
__global__ void sum_squares_blocks_kernel(const float* x, std::int64_t n, double* partial) {
  __shared__ double lane[threads];
  double sum = 0.0;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) {
    const double v = x[i];
    sum = __dadd_rn(sum, __dmul_rn(v, v));  // the product of two binary32 values is exact in binary64
  }
  lane[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) lane[threadIdx.x] = __dadd_rn(lane[threadIdx.x], lane[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = lane[0];
}

__global__ void sum_partials(const double* partial, unsigned count, double* result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0.0;
  for (unsigned b = 0; b < count; ++b) sum = __dadd_rn(sum, partial[b]);
  *result = sum;
}

// The largest finite |x| as its key (numerics.hpp's finite_amax_key): an
// integer max, so the order of the atomics cannot change the result.
__global__ void max_abs_finite_kernel(const float* x, std::int64_t n, std::uint32_t* result) {
  std::uint32_t largest = 0;
  for (std::int64_t i = thread_index(); i < n; i += thread_count()) largest = max(largest, core::finite_amax_key(x[i]));
  if (largest != 0) atomicMax(reinterpret_cast<unsigned int*>(result), largest);
}

}  // namespace

std::int64_t column_sums_scratch(std::int64_t rows, std::int64_t cols) {
  return rows > column_chunk ? chunks_of(rows) * cols : 0;
}

void column_sums(const float* x, std::int64_t rows, std::int64_t cols, float* sums, float* scratch,
                 cudaStream_t stream) {
  if (cols <= 0) return;
  if (rows <= 0) {
    MPSIM_CUDA_CHECK(cudaMemsetAsync(sums, 0, static_cast<std::size_t>(cols) * sizeof(float), stream));
    return;
  }
  const std::int64_t chunks = chunks_of(rows);
  if (chunks == 1) {
    column_chunk_sums<<<blocks(cols), threads, 0, stream>>>(x, rows, cols, sums);
    MPSIM_CUDA_CHECK_LAUNCH();
    return;
  }
  column_chunk_sums<<<blocks(chunks * cols), threads, 0, stream>>>(x, rows, cols, scratch);
  MPSIM_CUDA_CHECK_LAUNCH();
  add_chunks<<<blocks(cols), threads, 0, stream>>>(scratch, chunks, cols, sums);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void sum_squares(const float* x, std::int64_t n, double* partial, double* result, cudaStream_t stream) {
  // The grid depends on n only, so the order of the additions does too.
  const unsigned grid = n <= 0 ? 1u : std::min(sum_squares_blocks, blocks(n));
  sum_squares_blocks_kernel<<<grid, threads, 0, stream>>>(x, n, partial);
  MPSIM_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, 32, 0, stream>>>(partial, grid, result);
  MPSIM_CUDA_CHECK_LAUNCH();
}

void max_abs_finite(const float* x, std::int64_t n, std::uint32_t* result, cudaStream_t stream) {
  MPSIM_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(std::uint32_t), stream));
  if (n <= 0) return;
  max_abs_finite_kernel<<<std::min(sum_squares_blocks, blocks(n)), threads, 0, stream>>>(x, n, result);
  MPSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace mpsim::gpu::kernels
