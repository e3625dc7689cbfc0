// Block-scaled quantization on the device: one thread per 1 x N block, each
// running the host/device routine mpsim::detail::quantize_block_row, so the CPU's
// tests of that routine prove what the kernel computes (block_quantize.hpp).

#include "mpsim/gpu/block_quantize.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "mpsim/emulation/block_scaling.hpp"
#include "mpsim/emulation/pattern_format.hpp"

namespace mpsim::gpu {
namespace {

constexpr unsigned kThreads = 128;

__global__ void quantize_block_rows_kernel(mpsim::detail::BlockRule rule, PatternFormat<std::uint32_t> element,
                                           PatternRounding rounding, DrawKey key, std::uint64_t first_index,
                                           const float* in, float* out, std::int64_t rows, std::int64_t cols,
                                           int block, std::uint32_t* codes, unsigned long long* counts) {
  const std::int64_t per_row = (cols + block - 1) / block, total = rows * per_row;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < total;
       b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = b / per_row, c0 = b % per_row * block;
    const std::int64_t at = r * cols + c0;
    const int n = static_cast<int>(cols - c0 < block ? cols - c0 : block);
    mpsim::detail::BlockRowCounts c;
    const mpsim::detail::BlockParams p =
        mpsim::detail::quantize_block_row(rule, nullptr, element, rounding, key, first_index + static_cast<std::uint64_t>(at),
                                   in + at, out + at, n, c);
    codes[b] = p.code;
    atomicAdd(&counts[0], static_cast<unsigned long long>(c.nonzero));
    atomicAdd(&counts[1], static_cast<unsigned long long>(c.flushed));
    atomicAdd(&counts[2], static_cast<unsigned long long>(c.saturated));
    atomicAdd(&counts[3], static_cast<unsigned long long>(c.nan));
    atomicAdd(&counts[4], static_cast<unsigned long long>(p.clamped));
  }
}

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(std::size_t n) { MPSIM_CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

BlockSummary quantize_blocks_on_device(const BlockFormat& format_in, std::span<const float> in, std::span<float> out,
                                       std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options) {
  const BlockFormat format = format_in.for_shape(rows, cols);
  if (format.block_rows != 1 || !format.element.floating)
    throw std::invalid_argument("quantize_blocks_on_device: 1 x N blocks of floating-point elements only, not " +
                                format.name());
  if (rows < 0 || cols < 0 || in.size() != static_cast<std::size_t>(rows * cols) || out.size() != in.size())
    throw std::invalid_argument("quantize_blocks_on_device: sizes do not match");
  if (options.rounding.mode != RoundingMode::nearest_even && options.rounding.mode != RoundingMode::stochastic)
    throw std::invalid_argument("quantize_blocks_on_device: elements round to nearest-even or stochastic");
  const std::int64_t per_row = (cols + format.block_cols - 1) / format.block_cols, total = rows * per_row;
  const mpsim::detail::BlockRule rule = mpsim::detail::block_rule(format, in);
  const std::size_t n = in.size();
  DeviceBuffer<float> d_in(n), d_out(n);
  DeviceBuffer<std::uint32_t> d_codes(static_cast<std::size_t>(total));
  DeviceBuffer<unsigned long long> d_counts(5);
  MPSIM_CUDA_CHECK(cudaMemcpy(d_in.p, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemset(d_counts.p, 0, 5 * sizeof(unsigned long long)));
  if (total > 0) {
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((total + kThreads - 1) / kThreads, 4096));
    quantize_block_rows_kernel<<<grid, kThreads>>>(rule, binary32_pattern_format(*format.element.floating),
                                                   pattern_rounding(options.rounding), make_draw_key(options.key),
                                                   options.first_index, d_in.p, d_out.p, rows, cols,
                                                   format.block_cols, d_codes.p, d_counts.p);
    MPSIM_CUDA_CHECK(cudaGetLastError());
  }
  BlockSummary summary;
  summary.scale_codes.resize(static_cast<std::size_t>(total));
  unsigned long long counts[5] = {};
  MPSIM_CUDA_CHECK(cudaMemcpy(out.data(), d_out.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  MPSIM_CUDA_CHECK(cudaMemcpy(summary.scale_codes.data(), d_codes.p, summary.scale_codes.size() * sizeof(std::uint32_t),
                              cudaMemcpyDeviceToHost));
  MPSIM_CUDA_CHECK(cudaMemcpy(counts, d_counts.p, sizeof counts, cudaMemcpyDeviceToHost));
  summary.counts.elements = n;
  summary.counts.nonzero = counts[0];
  summary.counts.flushed = counts[1];
  summary.counts.saturated = counts[2];
  summary.counts.nan = counts[3];
  summary.counts.scale_clamped = counts[4];
  if (rule.kind == mpsim::detail::BlockKind::nvfp4)
    summary.tensor_scale = rule.tensor_nan ? std::numeric_limits<double>::quiet_NaN() : rule.tensor_scale;
  return summary;
}

}  // namespace mpsim::gpu
