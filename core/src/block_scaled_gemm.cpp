// Block-scaled GEMM operands, for every backend: each operand laid out
// k-major (as the hardware reads it), optionally Hadamard-transformed along
// k, quantized by the backend's step (the CPU's: quantize_block_operand, the
// reference's bits, proven in tests/emulation/test_block_formats.cpp),
// counted, and multiplied by its other step (the CPU's: block_gemm, exact
// block sums, as block-scaled tensor cores). Also the block statistics'
// accumulation (stats.hpp).

#include "mpsim/core/block_scaled_gemm.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/policy.hpp"
#include "mpsim/emulation/hadamard.hpp"

namespace mpsim::core {
namespace {

// op(x) with k along its rows: x itself (rows x cols) when k runs along its
// columns already, else its transpose.
std::vector<float> k_major(const float* x, std::int64_t rows, std::int64_t cols, bool transpose) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  if (!transpose) {
    std::copy(x, x + rows * cols, out.begin());
    return out;
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(c * rows + r)] = x[r * cols + c];
  return out;
}

// The transform of the leading whole chunks of 16 along k; the tail (k mod
// 16 values) is left as it is: still orthogonal, so the product is kept.
void hadamard_along_k(std::vector<float>& x, std::int64_t rows, std::int64_t k, std::uint64_t seed) {
  const std::int64_t whole = k / kHadamardSize * kHadamardSize;
  if (whole == 0) return;
  if (whole == k) return random_hadamard(x, rows, k, seed);  // no tail: in place
  std::vector<float> head(static_cast<std::size_t>(rows * whole));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(x.begin() + r * k, x.begin() + r * k + whole, head.begin() + r * whole);
  random_hadamard(head, rows, whole, seed);
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(head.begin() + r * whole, head.begin() + (r + 1) * whole, x.begin() + r * k);
}

BlockOperand quantize_operand(const GemmNumerics::BlockOperand& o, const std::vector<float>& x, std::int64_t rows,
                              std::int64_t k, const BlockGemmSteps& steps) {
  BlockQuantizeOptions options;
  options.rounding = o.point.rounding;
  options.key = o.stream.key;
  options.first_index = o.stream.first_index;
  BlockOperand q = steps.quantize(o.point.format, x, rows, k, options);
  if (o.stats) add_block_quantization(*o.stats, o.point.format.for_shape(rows, k), x, q, rows, k);
  return q;
}

}  // namespace

BlockGemmSteps cpu_block_gemm_steps() {
  BlockGemmSteps steps;
  steps.quantize = quantize_block_operand;
  steps.multiply = [](const BlockGemmModel& model, const BlockFormat& fa, const BlockOperand& a, const BlockFormat& fb,
                      const BlockOperand& bt, float* c, int m, int n, int k) { block_gemm(model, fa, a, fb, bt, c, m, n, k); };
  return steps;
}

void block_scaled_gemm(const float* a, bool ta, std::int64_t a_rows, std::int64_t a_cols, const float* b, bool tb,
                       std::int64_t b_rows, std::int64_t b_cols, float* c, const GemmNumerics& numerics,
                       const BlockGemmSteps& steps) {
  const auto& oa = *numerics.a_block;
  const auto& ob = *numerics.b_block;
  const std::int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
  const std::int64_t n = tb ? b_rows : b_cols;
  // A as m x k; B^T as n x k (b is k x n unless transposed).
  std::vector<float> ak = k_major(a, a_rows, a_cols, ta);
  std::vector<float> bk = k_major(b, b_rows, b_cols, !tb);
  if (oa.point.hadamard) {
    hadamard_along_k(ak, m, k, numerics.hadamard_seed);
    hadamard_along_k(bk, n, k, numerics.hadamard_seed);
  }
  const BlockOperand qa = quantize_operand(oa, ak, m, k, steps);
  const BlockOperand qb = quantize_operand(ob, bk, n, k, steps);
  BlockGemmModel model;
  if (numerics.block_promotion) {
    model.tensor_core = *numerics.block_promotion;
    const bool software_scales = oa.point.format.scale == ScaleFormat::binary32 || ob.point.format.scale == ScaleFormat::binary32;
    model.promotion_interval = software_scales ? static_cast<int>(oa.point.format.for_shape(m, k).block_cols)
                                               : numerics.block_promotion_interval;
  }
  steps.multiply(model, oa.point.format, qa, ob.point.format, qb, c, static_cast<int>(m), static_cast<int>(n),
                 static_cast<int>(k));
}

std::string block_gemm_refusal(const Backend& backend, const Policy& p) {
  for (const GemmRole role : {GemmRole::fprop, GemmRole::dgrad, GemmRole::wgrad}) {
    const BlockPoint& a = p.*(block_points[block_point_index(role, 0)].point);
    const BlockPoint& b = p.*(block_points[block_point_index(role, 1)].point);
    if (!a.enabled()) continue;
    std::string why = backend.block_gemm_refusal(a, b, block_promotion(p, a.format), p.block_promotion_interval);
    if (!why.empty()) return std::string(gemm_role_names(role)) + " GEMM: " + why;
  }
  return {};
}

BlockStats& BlockStats::operator+=(const BlockStats& o) {
  for (int i = 0; i < Binades::bin_count; ++i) scale_binades[i] += o.scale_binades[i];
  for (std::size_t i = 0; i < scale_codes.size(); ++i) scale_codes[i] += o.scale_codes[i];
  for (int i = 0; i < block_counter_count; ++i) counters[i] += o.counters[i];
  for (int i = 0; i < error_bins; ++i) error[i] += o.error[i];
  return *this;
}

void add_block_quantization(BlockStats& stats, const BlockFormat& format, std::span<const float> x,
                            const BlockOperand& q, std::int64_t rows, std::int64_t cols) {
  const BlockFormat f = format.for_shape(rows, cols);
  const std::int64_t grid_rows = (rows + f.block_rows - 1) / f.block_rows;
  const std::int64_t grid_cols = (cols + f.block_cols - 1) / f.block_cols;
  if (q.scales.size() != static_cast<std::size_t>(grid_rows * grid_cols) || x.size() != q.elements.size())
    throw std::invalid_argument("add_block_quantization: the quantized tensor does not match its format and shape");
  const double epsilon = f.element.floating ? std::ldexp(1.0, -f.element.floating->mantissa_bits)
                                            : std::ldexp(1.0, 2 - f.element.integer_bits);
  const BlockCounts& t = q.counts;
  stats[BlockCounter::elements] += t.elements;
  stats[BlockCounter::nonzero] += t.nonzero;
  stats[BlockCounter::saturated] += t.saturated;
  stats[BlockCounter::rounded_to_zero] += t.flushed;
  stats[BlockCounter::nan] += t.nan;
  stats[BlockCounter::scale_clamped] += t.scale_clamped;
  stats[BlockCounter::blocks] += static_cast<std::uint64_t>(grid_rows * grid_cols);
  for (std::int64_t br = 0; br < grid_rows; ++br) {
    for (std::int64_t bc = 0; bc < grid_cols; ++bc) {
      const std::size_t block = static_cast<std::size_t>(br * grid_cols + bc);
      const double scale = q.scales[block];
      // The scale's binade (E8M0 scales are powers of two; others binned by their exponent).
      int bin = Binades::nan_bin;
      if (scale == 0) bin = Binades::zero_bin;
      else if (std::isinf(scale)) bin = Binades::infinity_bin;
      else if (!std::isnan(scale))
        bin = Binades::bin_of_exponent(std::clamp(std::ilogb(scale), Binades::min_exponent, Binades::max_exponent));
      ++stats.scale_binades[static_cast<std::size_t>(bin)];
      if (f.scale != ScaleFormat::binary32) ++stats.scale_codes[q.scale_codes[block] & 0xff];
      // The block's relative error.
      double err = 0, norm = 0;
      bool nan = std::isnan(scale);
      for (std::int64_t r = br * f.block_rows; r < std::min(rows, (br + 1) * f.block_rows) && !nan; ++r)
        for (std::int64_t c = bc * f.block_cols; c < std::min(cols, (bc + 1) * f.block_cols); ++c) {
          const auto i = static_cast<std::size_t>(r * cols + c);
          // element x scale x tensor scale, exact in binary64: an element has at most 16 significant
          // bits, the scales together at most 28 (NVFP4's UE4M3 x binary32).
          const double value = static_cast<double>(q.elements[i]) * scale * q.tensor_scale;
          const double v = x[i], d = value - v;
          if (std::isnan(value) || !std::isfinite(v)) nan = true;
          err += d * d;
          norm += v * v;
        }
      int error_bin = BlockStats::error_zero_bin;
      if (nan) {
        error_bin = BlockStats::error_nan_bin;
      } else if (err > 0) {
        const double relative = std::sqrt(err / norm) / epsilon;
        const double position =
            (std::log2(relative) - BlockStats::error_min_exponent) * BlockStats::error_bins_per_binade;
        error_bin = static_cast<int>(std::clamp(std::floor(position), 0.0, BlockStats::error_finite_bins - 1.0));
      }
      ++stats.error[static_cast<std::size_t>(error_bin)];
    }
  }
}

}  // namespace mpsim::core
