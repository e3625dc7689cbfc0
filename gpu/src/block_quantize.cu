// Block-scaled quantization and GEMMs on the device: one thread per 1 x N
// block, each running the host/device routine
// mpsim::detail::quantize_block_row, and one thread per GEMM output running
// mpsim::block_scaled_dot, so the CPU's tests of those routines prove what the
// kernels compute (block_quantize.hpp).

#include "mpsim/gpu/block_quantize.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "mpsim/emulation/block_dot.hpp"
#include "mpsim/emulation/block_gemm.hpp"
#include "mpsim/emulation/block_scaling.hpp"
#include "mpsim/emulation/pattern_format.hpp"

namespace mpsim::gpu {
namespace {

constexpr unsigned kThreads = 128;

// 2-D tiles (block_rows > 1): one thread per tile finds its largest
// magnitude over the tile's rows and its scale (block_params), before any row
// is quantized, as quantize_blocks does.
__global__ void tile_params_kernel(mpsim::detail::BlockRule rule, const float* in, std::int64_t rows, std::int64_t cols,
                                   int block_rows, int block_cols, mpsim::detail::BlockParams* params,
                                   std::uint32_t* codes, unsigned long long* counts) {
  const std::int64_t grid_cols = (cols + block_cols - 1) / block_cols;
  const std::int64_t total = (rows + block_rows - 1) / block_rows * grid_cols;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r0 = t / grid_cols * block_rows, c0 = t % grid_cols * block_cols;
    const std::int64_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
    const std::int64_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
    std::uint32_t amax = 0;
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::uint32_t a = std::bit_cast<std::uint32_t>(in[r * cols + c]) & 0x7FFFFFFFu;
        amax = a > amax ? a : amax;
      }
    params[t] = mpsim::detail::block_params(rule, amax);
    codes[t] = params[t].code;
    atomicAdd(&counts[4], static_cast<unsigned long long>(params[t].clamped));
  }
}

// One thread per 1 x N row segment: a whole block, or a row's part of a 2-D
// tile whose parameters `tiles` holds (then the tile kernel wrote the codes).
__global__ void quantize_block_rows_kernel(mpsim::detail::BlockRule rule, PatternFormat<std::uint32_t> element,
                                           PatternRounding rounding, DrawKey key, std::uint64_t first_index,
                                           const float* in, float* out, float* elements, std::int64_t rows,
                                           std::int64_t cols, int block, int block_rows,
                                           const mpsim::detail::BlockParams* tiles, std::uint32_t* codes,
                                           unsigned long long* counts) {
  const std::int64_t per_row = (cols + block - 1) / block, total = rows * per_row;
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < total;
       b += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = b / per_row, c0 = b % per_row * block;
    const std::int64_t at = r * cols + c0;
    const int n = static_cast<int>(cols - c0 < block ? cols - c0 : block);
    const mpsim::detail::BlockParams* given = tiles != nullptr ? tiles + (r / block_rows * per_row + c0 / block) : nullptr;
    mpsim::detail::BlockRowCounts c;
    const mpsim::detail::BlockParams p =
        mpsim::detail::quantize_block_row(rule, given, element, rounding, key, first_index + static_cast<std::uint64_t>(at),
                                   in + at, out + at, n, c, elements != nullptr ? elements + at : nullptr);
    if (given == nullptr) {
      codes[b] = p.code;
      atomicAdd(&counts[4], static_cast<unsigned long long>(p.clamped));
    }
    atomicAdd(&counts[0], static_cast<unsigned long long>(c.nonzero));
    atomicAdd(&counts[1], static_cast<unsigned long long>(c.flushed));
    atomicAdd(&counts[2], static_cast<unsigned long long>(c.saturated));
    atomicAdd(&counts[3], static_cast<unsigned long long>(c.nan));
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

// The quantization on the device: values into `out`, elements into `elements` when not empty.
BlockSummary run_on_device(const BlockFormat& format_in, std::span<const float> in, std::span<float> out,
                           std::span<float> elements, std::int64_t rows, std::int64_t cols,
                           const BlockQuantizeOptions& options) {
  const BlockFormat format = format_in.for_shape(rows, cols);
  if (rows < 0 || cols < 0 || in.size() != static_cast<std::size_t>(rows * cols) || out.size() != in.size() ||
      (!elements.empty() && elements.size() != in.size()))
    throw std::invalid_argument("quantize_blocks_on_device: sizes do not match");
  if (options.rounding.mode != RoundingMode::nearest_even && options.rounding.mode != RoundingMode::stochastic)
    throw std::invalid_argument("quantize_blocks_on_device: elements round to nearest-even or stochastic");
  const std::int64_t per_row = (cols + format.block_cols - 1) / format.block_cols, segments = rows * per_row;
  const bool tiled = format.block_rows > 1;
  const std::int64_t scales = tiled ? (rows + format.block_rows - 1) / format.block_rows * per_row : segments;
  const mpsim::detail::BlockRule rule = mpsim::detail::block_rule(format, in);
  const std::size_t n = in.size();
  DeviceBuffer<float> d_in(n), d_out(n), d_elements(elements.empty() ? 0 : n);
  DeviceBuffer<std::uint32_t> d_codes(static_cast<std::size_t>(scales));
  DeviceBuffer<mpsim::detail::BlockParams> d_tiles(tiled ? static_cast<std::size_t>(scales) : 0);
  DeviceBuffer<unsigned long long> d_counts(5);
  MPSIM_CUDA_CHECK(cudaMemcpy(d_in.p, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemset(d_counts.p, 0, 5 * sizeof(unsigned long long)));
  const auto grid_for = [](std::int64_t threads) {
    return static_cast<unsigned>(std::min<std::int64_t>((threads + kThreads - 1) / kThreads, 4096));
  };
  if (tiled && scales > 0) {
    tile_params_kernel<<<grid_for(scales), kThreads>>>(rule, d_in.p, rows, cols, format.block_rows, format.block_cols,
                                                       d_tiles.p, d_codes.p, d_counts.p);
    MPSIM_CUDA_CHECK(cudaGetLastError());
  }
  if (segments > 0) {
    quantize_block_rows_kernel<<<grid_for(segments), kThreads>>>(
        rule, mpsim::detail::element_pattern_format(format.element), pattern_rounding(options.rounding),
        make_draw_key(options.key), options.first_index, d_in.p, d_out.p, elements.empty() ? nullptr : d_elements.p,
        rows, cols, format.block_cols, format.block_rows, tiled ? d_tiles.p : nullptr, d_codes.p, d_counts.p);
    MPSIM_CUDA_CHECK(cudaGetLastError());
  }
  BlockSummary summary;
  summary.scale_codes.resize(static_cast<std::size_t>(scales));
  unsigned long long counts[5] = {};
  MPSIM_CUDA_CHECK(cudaMemcpy(out.data(), d_out.p, n * sizeof(float), cudaMemcpyDeviceToHost));
  if (!elements.empty())
    MPSIM_CUDA_CHECK(cudaMemcpy(elements.data(), d_elements.p, n * sizeof(float), cudaMemcpyDeviceToHost));
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

// `exact`: blocks whose sums can exceed binary64 (MXFP8 E5M2) through
// block_scaled_dot_exact's 128-bit integer sums, with min_a and min_b the
// formats' smallest exponents; otherwise block_scaled_dot's binary64 sums.
__global__ void block_gemm_kernel(const float* a, const double* a_scales, int a_block_rows, int min_a, const float* b,
                                  const double* b_scales, int b_block_rows, int min_b, float* c, int m, int n, int k,
                                  int block, int grid_cols, bool exact, float alpha) {
  const std::int64_t total = static_cast<std::int64_t>(m) * n;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx / n), j = static_cast<int>(idx % n);
    const float* a_row = a + static_cast<std::int64_t>(i) * k;
    const float* b_row = b + static_cast<std::int64_t>(j) * k;
    const double* sa = a_scales + static_cast<std::int64_t>(i / a_block_rows) * grid_cols;
    const double* sb = b_scales + static_cast<std::int64_t>(j / b_block_rows) * grid_cols;
    float d = exact ? block_scaled_dot_exact(a_row, sa, min_a, b_row, sb, min_b, k, block)
                    : block_scaled_dot(a_row, sa, b_row, sb, k, block);
    if (alpha != 1.0f) d = d * alpha;
    c[idx] = d;
  }
}

// Binary32 scales with one block spanning k (per tensor, or per row tile):
// each output the exact sum rounded once, times alpha = sa sb (one binary32
// product each), as block_gemm's per-tensor path.
__global__ void per_tensor_gemm_kernel(const float* a, const double* a_scales, int a_block_rows, int min_a,
                                       const float* b, const double* b_scales, int b_block_rows, int min_b, float* c,
                                       int m, int n, int k, float alpha) {
  const std::int64_t total = static_cast<std::int64_t>(m) * n;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx / n), j = static_cast<int>(idx % n);
    float d = per_tensor_exact_dot(a + static_cast<std::int64_t>(i) * k, min_a, b + static_cast<std::int64_t>(j) * k,
                                   min_b, k);
    d *= static_cast<float>(a_scales[i / a_block_rows]) * static_cast<float>(b_scales[j / b_block_rows]);
    if (alpha != 1.0f) d = d * alpha;
    c[idx] = d;
  }
}

}  // namespace

std::string block_gemm_refusal_on_device(const BlockFormat& a, const BlockFormat& b, int k) {
  if ((a.scale == ScaleFormat::binary32) != (b.scale == ScaleFormat::binary32))
    return "one operand has binary32 scales and the other not; the device GEMM takes both or neither";
  if (a.scale == ScaleFormat::binary32) {
    // Software scales: the device takes them where one block spans k (per tensor, or k within a tile), as
    // block_gemm without a tensor-core model; shorter blocks need DeepSeek-V3's promotion.
    if (!a.one_block_along(k) || !b.one_block_along(k))
      return (a.one_block_along(k) ? b : a).name() + " has binary32 (software) scales on blocks shorter than k (DeepSeek-V3's " +
             "tiles), which take a tensor-core promotion model; the device GEMM takes binary32 scales per tensor only";
    if (!per_tensor_sums_fit_int128(a.element, b.element, k > 0 ? k : (1 << 30)))
      return "sums of " + a.element.name() + " and " + b.element.name() + " can exceed the device's 128-bit sum";
    return {};
  }
  if (a.block_cols != b.block_cols) return "the operands' blocks along k differ";
  if (!block_partials_fit_binary64(a, b, a.block_cols)) {
    // Summed as 128-bit integers (block_scaled_dot_exact), as block_gemm's wide path: power-of-two scales only.
    if (a.scale != ScaleFormat::e8m0 || b.scale != ScaleFormat::e8m0)
      return "block sums of " + a.element.name() + " and " + b.element.name() +
             " exceed binary64; their exact sums take E8M0 (power-of-two) scales only, as block_gemm's";
    if (!block_partials_fit_int128(a, b, a.block_cols))
      return "block sums of " + a.element.name() + " and " + b.element.name() + " can exceed the device's 128-bit sum";
  }
  return {};
}

BlockSummary quantize_blocks_on_device(const BlockFormat& format, std::span<const float> in, std::span<float> out,
                                       std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options) {
  return run_on_device(format, in, out, {}, rows, cols, options);
}

BlockOperand quantize_block_operand_on_device(const BlockFormat& format_in, std::span<const float> in,
                                              std::int64_t rows, std::int64_t cols,
                                              const BlockQuantizeOptions& options) {
  const BlockFormat format = format_in.for_shape(rows, cols);
  std::vector<float> values(in.size()), elements(in.size());
  BlockSummary s = run_on_device(format, in, values, elements, rows, cols, options);
  return to_block_operand(format, std::move(s), std::move(elements));
}

void block_gemm_on_device(const BlockFormat& fa_in, const BlockOperand& a, const BlockFormat& fb_in,
                          const BlockOperand& bt, float* c, int m, int n, int k) {
  const BlockFormat fa = fa_in.for_shape(m, k), fb = fb_in.for_shape(n, k);
  if (const std::string why = block_gemm_refusal_on_device(fa, fb, k); !why.empty())
    throw std::invalid_argument("block_gemm_on_device: " + why);
  const bool per_tensor = fa.scale == ScaleFormat::binary32 || fb.scale == ScaleFormat::binary32;
  const int grid_cols = (k + fa.block_cols - 1) / fa.block_cols;
  const auto grid = [&](const BlockFormat& f, int rows) {
    return static_cast<std::size_t>((rows + f.block_rows - 1) / f.block_rows) * static_cast<std::size_t>(grid_cols);
  };
  if (m < 0 || n < 0 || k < 0 || a.elements.size() != static_cast<std::size_t>(m) * k ||
      bt.elements.size() != static_cast<std::size_t>(n) * k || a.scales.size() != grid(fa, m) ||
      bt.scales.size() != grid(fb, n))
    throw std::invalid_argument("block_gemm_on_device: sizes do not match");
  const std::size_t outputs = static_cast<std::size_t>(m) * n;
  DeviceBuffer<float> d_a(a.elements.size()), d_b(bt.elements.size()), d_c(outputs);
  DeviceBuffer<double> d_sa(a.scales.size()), d_sb(bt.scales.size());
  MPSIM_CUDA_CHECK(cudaMemcpy(d_a.p, a.elements.data(), a.elements.size() * sizeof(float), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(d_b.p, bt.elements.data(), bt.elements.size() * sizeof(float), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(d_sa.p, a.scales.data(), a.scales.size() * sizeof(double), cudaMemcpyHostToDevice));
  MPSIM_CUDA_CHECK(cudaMemcpy(d_sb.p, bt.scales.data(), bt.scales.size() * sizeof(double), cudaMemcpyHostToDevice));
  const auto alpha = static_cast<float>(static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale));
  if (outputs > 0) {
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>((outputs + kThreads - 1) / kThreads, 4096));
    if (per_tensor)
      per_tensor_gemm_kernel<<<blocks, kThreads>>>(d_a.p, d_sa.p, fa.block_rows, smallest_exponent(fa.element), d_b.p,
                                                   d_sb.p, fb.block_rows, smallest_exponent(fb.element), d_c.p, m, n, k,
                                                   alpha);
    else
      block_gemm_kernel<<<blocks, kThreads>>>(d_a.p, d_sa.p, fa.block_rows, smallest_exponent(fa.element), d_b.p,
                                              d_sb.p, fb.block_rows, smallest_exponent(fb.element), d_c.p, m, n, k,
                                              fa.block_cols, grid_cols,
                                              !block_partials_fit_binary64(fa, fb, fa.block_cols), alpha);
    MPSIM_CUDA_CHECK(cudaGetLastError());
  }
  MPSIM_CUDA_CHECK(cudaMemcpy(c, d_c.p, outputs * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace mpsim::gpu
