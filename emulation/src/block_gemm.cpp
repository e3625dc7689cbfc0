#include "mpsim/emulation/block_gemm.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/emulation/block_dot.hpp"
#include "mpsim/emulation/round_to_odd.hpp"
#include "exact_accumulator.hpp"

namespace mpsim {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// The element values of a quantized operand (rows x k), NaN in NaN blocks.
Matrix element_values(const BlockFormat& f, const BlockOperand& q, int rows, int k) {
  Matrix v(rows, k);
  const int grid_cols = (k + f.block_cols - 1) / f.block_cols;
  for (int r = 0; r < rows; ++r) {
    const float* row = q.elements.data() + static_cast<std::size_t>(r) * k;
    const double* scales = q.scales.data() + static_cast<std::size_t>(r / f.block_rows) * grid_cols;
    for (int j = 0; j < k; ++j) v(r, j) = std::isnan(scales[j / f.block_cols]) ? kNan : row[j];
  }
  return v;
}

// Each row's scale of each block along k: rows x blocks.
Matrix row_scales(const BlockFormat& f, const BlockOperand& q, int rows, int k) {
  const int grid_cols = (k + f.block_cols - 1) / f.block_cols;
  Matrix s(rows, grid_cols);
  for (int r = 0; r < rows; ++r)
    for (int kb = 0; kb < grid_cols; ++kb) s(r, kb) = q.scales[static_cast<std::size_t>(r / f.block_rows * grid_cols + kb)];
  return s;
}

// Whether this block's sums are exact in binary64 for the elements it holds
// (not the formats' worst case): every product lies on the grid 2^(lsb_a +
// lsb_b) below 2^(top_a + top_b), where 2^top bounds the block's elements (frexp)
// over all rows and lsb is the lowest last significand bit among them;
// `width` products add log2(width) bits.
bool block_sums_fit(const Matrix& ea, const Matrix& eb, int k0, int width) {
  const auto range = [&](const Matrix& e, int& top, int& lsb) {
    top = std::numeric_limits<int>::min();
    lsb = std::numeric_limits<int>::max();
    for (int r = 0; r < e.rows(); ++r)
      for (int t = k0; t < k0 + width; ++t) {
        const double v = e(r, t);
        if (v == 0 || !std::isfinite(v)) continue;
        // v = significand 2^(exponent - 53), the significand a 53-bit integer (frexp's exponent), read from
        // the pattern: every element is a binary32 value, a normal binary64.
        const auto bits = std::bit_cast<std::uint64_t>(v);
        const int exponent = static_cast<int>((bits >> 52) & 0x7FF) - 1022;
        const std::uint64_t significand = (bits & 0xFFFFFFFFFFFFFull) | (1ull << 52);
        top = std::max(top, exponent);
        lsb = std::min(lsb, exponent - 53 + std::countr_zero(significand));
      }
  };
  int top_a = 0, lsb_a = 0, top_b = 0, lsb_b = 0;
  range(ea, top_a, lsb_a);
  range(eb, top_b, lsb_b);
  if (top_a == std::numeric_limits<int>::min() || top_b == std::numeric_limits<int>::min()) return true;  // zeros
  return (top_a + top_b) - (lsb_a + lsb_b) + static_cast<int>(std::ceil(std::log2(width))) <= 53;
}

// acc = RN32(acc + sum_k a_k b_k 2^(e_a + e_b)) for block kb, exactly, when the
// block sum is wider than binary64 (MXFP8 E5M2): every element is an integer
// times 2^(its format's smallest exponent), every product an integer of at most
// 64 bits, added with the scale exponents to a 640-bit fixed-point sum.
void accumulate_wide(const Matrix& ea, const Matrix& eb, const Matrix& sa, const Matrix& sb, int min_a, int min_b,
                     int kb, int k0, int width, std::vector<float>& acc, int m, int n) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float& s = acc[static_cast<std::size_t>(i) * n + j];
      bool nan = std::isnan(s) || std::isnan(sa(i, kb)) || std::isnan(sb(j, kb));
      const int scale = nan ? 0 : std::ilogb(sa(i, kb)) + std::ilogb(sb(j, kb));  // ilogb(NaN) is INT_MIN
      detail::ExactAccumulator sum;
      bool nonzero = false;
      for (int t = k0; t < k0 + width && !nan; ++t) {
        const double x = ea(i, t), y = eb(j, t);
        if (std::isnan(x) || std::isnan(y)) nan = true;
        if (x == 0 || y == 0) continue;
        const auto ix = static_cast<std::uint64_t>(std::fabs(std::ldexp(x, -min_a)));  // exact integers
        const auto iy = static_cast<std::uint64_t>(std::fabs(std::ldexp(y, -min_b)));
        sum.add((x < 0) != (y < 0), ix * iy, min_a + min_b + scale);
        nonzero = true;
      }
      if (nan) {
        s = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (!nonzero) {  // a zero partial adds +0 (-0 becomes +0), as the binary64 path's partial + 0.0
        s += 0.0f;
        continue;
      }
      if (std::isinf(s)) continue;  // inf stays
      if (s != 0) {
        int e = 0;
        const double mantissa = std::frexp(static_cast<double>(s), &e);  // s = mantissa 2^e, |mantissa| in [0.5, 1)
        const auto significand = static_cast<std::uint64_t>(std::fabs(std::ldexp(mantissa, 24)));
        sum.add(s < 0, significand, e - 24);
      }
      s = sum.is_zero() ? 0.0f
                        : to_float(formats::binary32, detail::round_exact(formats::binary32, Rounding{}, sum.value(), 0).bits);
    }
  }
}

// The accumulators to C: NVFP4's tensor scales once (cuBLASLt's alpha =
// s_a s_b, one binary32 multiplication), then C added with one rounding.
void write_output(const std::vector<float>& acc, const BlockOperand& a, const BlockOperand& bt, float* c,
                  bool accumulate_c) {
  const auto alpha = static_cast<float>(static_cast<float>(a.tensor_scale) * static_cast<float>(bt.tensor_scale));
  for (std::size_t i = 0; i < acc.size(); ++i) {
    float d = acc[i];
    if (alpha != 1.0f) d = d * alpha;
    c[i] = accumulate_c ? c[i] + d : d;
  }
}

// The tensor-core model's input for the unscaled elements of binary32-scaled
// blocks: gemm rounds its operands to the model's input first, so mixed
// elements (E5M2 gradients times E4M3 weights: fp8-current's dgrad and wgrad)
// take a format that holds both exactly, the widest exponent with the widest
// significand (E5M3, as the FP8 tensor-core check does: docs/tensor_cores.md);
// the model's input of one element format stays as it is.
Format joint_input(const TensorCoreModel& model, const ElementFormat& a, const ElementFormat& b) {
  if (a == b || !a.floating || !b.floating) return model.input;
  return Format{std::max(a.floating->exponent_bits, b.floating->exponent_bits),
                std::max(a.floating->mantissa_bits, b.floating->mantissa_bits)};
}

// Block-scaled tensor cores with the scales in hardware (E8M0, UE4M3): the
// products of scaled elements (element x its block's scale, exact in binary32
// or refused) through the tensor-core model, whose inputs are then binary32,
// over each promotion interval (0: all of k); each interval's partial added to
// a binary32 accumulator that starts at +0 (one rounding per addition), or,
// without promotion, the model's result itself. NVFP4's tensor scales
// (alpha) and C are applied last, as in the exact paths.
void scaled_tensor_core_gemm(const TensorCoreModel& tensor_core, int interval, const BlockFormat& fa,
                             const BlockOperand& a, const BlockFormat& fb, const BlockOperand& bt, float* c, int m,
                             int n, int k, bool accumulate_c) {
  const auto scaled = [](const BlockFormat& f, const BlockOperand& q, int rows, int k) {
    const int grid_cols = (k + f.block_cols - 1) / f.block_cols;
    std::vector<float> x(static_cast<std::size_t>(rows) * k);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < k; ++j) {
        const auto i = static_cast<std::size_t>(r) * k + j;
        const double scale = q.scales[static_cast<std::size_t>(r / f.block_rows * grid_cols + j / f.block_cols)];
        const double value = static_cast<double>(q.elements[i]) * scale;  // exact in binary64
        x[i] = static_cast<float>(value);
        if (!std::isnan(value) && static_cast<double>(x[i]) != value)
          throw std::invalid_argument("block_gemm: a scaled element (" + std::to_string(value) +
                                      ") is not a binary32 value; the tensor-core model takes binary32 products");
      }
    return x;
  };
  const std::vector<float> x = scaled(fa, a, m, k), yt = scaled(fb, bt, n, k);
  AccumulationModel tc;
  tc.kind = AccumulationKind::tensor_core;
  tc.tensor_core = tensor_core;
  // The model's inputs: the scaled elements as they are. A scaled element keeps its element's significand, so
  // binary32's exponent range with the elements' mantissa bits (E8M3 for FP8 E4M3) holds every one (checked:
  // the pattern's lower fraction bits are zero, subnormals included, as both formats' emin is -126): the model
  // then sees the same values and the same emin as with binary32 inputs, and takes its vector kernel (inputs
  // of at most 12 significant bits; accumulation_gemm.cpp).
  // (A UE4M3 scale's 4 significant bits add 4 to the element's: NVFP4's scaled elements have up to 6.)
  const auto bits = [](const BlockFormat& f) {
    return std::min(23, (f.element.floating ? f.element.floating->mantissa_bits : 23) +
                            (f.scale == ScaleFormat::ue4m3 ? 4 : 0));
  };
  Format narrow = formats::binary32;
  narrow.mantissa_bits = std::max(bits(fa), bits(fb));
  const std::uint32_t low_bits = (std::uint32_t{1} << (23 - narrow.mantissa_bits)) - 1;
  const auto fits = [&](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [&](float e) {
      return !std::isfinite(e) || (std::bit_cast<std::uint32_t>(e) & low_bits) == 0;
    });
  };
  tc.tensor_core.input = fits(x) && fits(yt) ? narrow : formats::binary32;
  tc.format = tensor_core.output;
  tc.mode = tensor_core.rounding;
  const int step = interval == 0 ? std::max(k, 1) : interval;
  std::vector<float> acc(static_cast<std::size_t>(m) * n, 0.0f), p(acc.size());
  for (int k0 = 0; k0 < k; k0 += step) {
    const int width = std::min(step, k - k0);
    std::vector<float> xs(static_cast<std::size_t>(m) * width), ys(static_cast<std::size_t>(width) * n);
    for (int i = 0; i < m; ++i)
      for (int t = 0; t < width; ++t) xs[static_cast<std::size_t>(i) * width + t] = x[static_cast<std::size_t>(i) * k + k0 + t];
    for (int t = 0; t < width; ++t)
      for (int j = 0; j < n; ++j) ys[static_cast<std::size_t>(t) * n + j] = yt[static_cast<std::size_t>(j) * k + k0 + t];
    gemm(tc, xs.data(), ys.data(), p.data(), m, n, width, false, 1);
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = interval == 0 ? p[i] : acc[i] + p[i];
  }
  write_output(acc, a, bt, c, accumulate_c);
}

}  // namespace

int smallest_exponent(const ElementFormat& e) {
  if (e.floating) return e.floating->emin() - e.floating->mantissa_bits;
  return -e.fraction_bits;
}

namespace {

// The bits of an element's magnitude as an integer times 2^smallest_exponent:
// every element lies below 2^(emax + 1).
int integer_span(const ElementFormat& e) { return e.emax() + 1 - smallest_exponent(e); }

// The bits that a sum of `count` terms adds to its largest term's.
int carry_bits(int count) { return static_cast<int>(std::ceil(std::log2(std::max(count, 1)))); }

}  // namespace

bool block_partials_fit_binary64(const BlockFormat& a, const BlockFormat& b, int block) {
  // The products lie on the grid 2^(e_a + e_b) below 2^(emax_a + emax_b + 2), and `block` of them add at most
  // log2(block) bits.
  return integer_span(a.element) + integer_span(b.element) + carry_bits(block) <= 53;
}

bool block_partials_fit_int128(const BlockFormat& a, const BlockFormat& b, int block) {
  const int span = integer_span(a.element) + integer_span(b.element);
  return span <= 64 && span + carry_bits(block) <= 127;
}

namespace {

// The split s for which A's elements below 2^(s + min_a) and those at or above
// it, each times B's, sum exactly in binary64 over k products (every partial
// sum on its products' grid within 53 bits); -1 when no split does. Elements
// at or above 2^(s + min_a) lie on the grid 2^(s + min_a - mantissa bits).
int two_part_split(const ElementFormat& a, const ElementFormat& b, int k) {
  if (!a.floating) return -1;
  // The low part as wide as binary64 allows (`room` bits); the high part then spans the rest.
  const int room = 53 - integer_span(b) - carry_bits(k);
  return room > 0 && integer_span(a) + a.floating->mantissa_bits - room <= room ? room : -1;
}

}  // namespace

bool per_tensor_sums_fit_int128(const ElementFormat& a, const ElementFormat& b, int k) {
  // Each element an integer of span bits times 2^min, each product within 64 bits; k products add
  // ceil(log2 k) bits, with the sign within 128; the rounded sum,
  // 24 bits at 2^(width - 24 + min_a + min_b), must be a normal binary32.
  const int min_a = smallest_exponent(a), min_b = smallest_exponent(b);
  const int span = integer_span(a) + integer_span(b), width = span + carry_bits(k);
  return span <= 64 && width <= 127 && min_a + min_b >= -126 && width + min_a + min_b <= 127;
}

void block_gemm(const BlockGemmModel& model, const BlockFormat& fa_in, const BlockQuantized& a,
                const BlockFormat& fb_in, const BlockQuantized& bt, float* c, int m, int n, int k, bool accumulate_c) {
  block_gemm(model, fa_in, to_block_operand(fa_in, a), fb_in, to_block_operand(fb_in, bt), c, m, n, k, accumulate_c);
}

void block_gemm(const BlockGemmModel& model, const BlockFormat& fa_in, const BlockOperand& a,
                const BlockFormat& fb_in, const BlockOperand& bt, float* c, int m, int n, int k, bool accumulate_c) {
  const BlockFormat fa = fa_in.for_shape(m, k), fb = fb_in.for_shape(n, k);
  const auto grid = [k](const BlockFormat& f, int rows) {
    return static_cast<std::size_t>((rows + f.block_rows - 1) / f.block_rows) * ((k + f.block_cols - 1) / f.block_cols);
  };
  if (m < 0 || n < 0 || k < 0 || a.elements.size() != static_cast<std::size_t>(m) * k ||
      bt.elements.size() != static_cast<std::size_t>(n) * k || a.scales.size() != grid(fa, m) ||
      bt.scales.size() != grid(fb, n))
    throw std::invalid_argument("block_gemm: A must be " + std::to_string(m) + " x " + std::to_string(k) + " and B^T " +
                                std::to_string(n) + " x " + std::to_string(k));
  if (fa.block_cols != fb.block_cols)
    throw std::invalid_argument("block_gemm: the operands' blocks along k differ (" + std::to_string(fa.block_cols) +
                                " and " + std::to_string(fb.block_cols) + ")");
  const int block = fa.block_cols;
  const bool binary32_scales = fa.scale == ScaleFormat::binary32 || fb.scale == ScaleFormat::binary32;
  const int interval = model.promotion_interval;
  if (!model.tensor_core && interval != 0)
    throw std::invalid_argument("block_gemm: a promotion interval needs a tensor-core model for the partials");
  if (model.tensor_core && binary32_scales && interval != block)
    throw std::invalid_argument("block_gemm: binary32 (software) scales promote once per block: the interval must "
                                "be the block length along k (" + std::to_string(block) + "), got " +
                                std::to_string(interval));
  if (model.tensor_core && !binary32_scales && (interval < 0 || interval % block != 0))
    throw std::invalid_argument("block_gemm: the promotion interval must be a multiple of the block length along k (" +
                                std::to_string(block) + ") or 0 (never), got " + std::to_string(interval));
  if (model.tensor_core && !binary32_scales) {
    scaled_tensor_core_gemm(*model.tensor_core, interval, fa, a, fb, bt, c, m, n, k, accumulate_c);
    return;
  }
  bool wide = false;  // block sums wider than binary64: exact fixed point (ExactAccumulator), term by term
  if (!model.tensor_core) {
    if (binary32_scales && block < k)
      throw std::invalid_argument("block_gemm: binary32 block scales take DeepSeek-V3's promotion "
                                  "(promotion_interval = the block length and a tensor-core model), unless one "
                                  "block spans k (per-tensor scales)");
    wide = !block_partials_fit_binary64(fa, fb, block);
    const bool power_of_two_scales = fa.scale == ScaleFormat::e8m0 && fb.scale == ScaleFormat::e8m0;
    if (wide && !power_of_two_scales && !binary32_scales)
      throw std::invalid_argument("block_gemm: block sums of " + fa.element.name() + " and " + fb.element.name() +
                                  " need more bits than binary64 holds exactly; the "
                                  "exact fixed-point path takes only E8M0 (power-of-two) scales");
  }
  const Matrix ea = element_values(fa, a, m, k), eb = element_values(fb, bt, n, k);
  const Matrix sa_all = row_scales(fa, a, m, k), sb_all = row_scales(fb, bt, n, k);
  std::vector<float> acc(static_cast<std::size_t>(m) * n, 0.0f);
  const int blocks = (k + block - 1) / block;
  Matrix partial(m, n);
  for (int kb = 0; kb < blocks; ++kb) {
    const int k0 = kb * block, width = std::min(block, k - k0);
    if (binary32_scales && !model.tensor_core) {
      // One block spans k, scaled per tensor (or per row tile) in binary32, as
      // cuBLAS's FP8 GEMMs take scale_a and scale_b: the exact sum rounded
      // once to binary32, then times alpha = sa * sb (one binary32 product
      // each).
      const bool exceeds_binary64 = wide && !block_sums_fit(ea, eb, k0, width);
      const int split = exceeds_binary64 ? two_part_split(fa.element, fb.element, width) : -1;
      if (split >= 0) {
        // Two binary64 GEMMs, each exact: A's elements of at least 2^(split + min_a) and the rest (FP8 E5M2
        // against E4M3: 2^0 and below), then each output's two exact sums added with one rounding to odd
        // and rounded to binary32: the exact sum rounded once (Boldo and Melquiond, round_to_odd.hpp).
        const double threshold = std::ldexp(1.0, split + smallest_exponent(fa.element));
        const auto a_block = ea.middleCols(k0, width);
        Matrix part = (a_block.array().abs() >= threshold).select(a_block, 0.0);  // the high elements
        partial.noalias() = part * eb.middleCols(k0, width).transpose();
        part = a_block - part;  // the low ones: exact, each element is one or the other (NaN stays NaN)
        Matrix rest(m, n);
        rest.noalias() = part * eb.middleCols(k0, width).transpose();
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j)
            acc[static_cast<std::size_t>(i) * n + j] =
                static_cast<float>(add_round_to_odd(partial(i, j), rest(i, j)) + 0.0);
      } else if (exceeds_binary64 && per_tensor_sums_fit_int128(fa.element, fb.element, width)) {
        // The device's routine (block_dot.hpp): 128-bit integer sums, many times faster than the general
        // fixed point below, and the same bits by construction.
        const int min_a = smallest_exponent(fa.element), min_b = smallest_exponent(fb.element);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j)
            acc[static_cast<std::size_t>(i) * n + j] =
                per_tensor_exact_dot(a.elements.data() + static_cast<std::size_t>(i) * k + k0, min_a,
                                     bt.elements.data() + static_cast<std::size_t>(j) * k + k0, min_b, width);
      } else if (exceeds_binary64) {
        accumulate_wide(ea, eb, Matrix::Ones(m, 1), Matrix::Ones(n, 1), smallest_exponent(fa.element),
                        smallest_exponent(fb.element), 0, k0, width, acc, m, n);
      } else {
        partial.noalias() = ea.middleCols(k0, width) * eb.middleCols(k0, width).transpose();
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) acc[static_cast<std::size_t>(i) * n + j] = static_cast<float>(partial(i, j) + 0.0);
      }
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          const float alpha = static_cast<float>(sa_all(i, kb)) * static_cast<float>(sb_all(j, kb));
          acc[static_cast<std::size_t>(i) * n + j] *= alpha;
        }
    } else if (wide && !block_sums_fit(ea, eb, k0, width)) {
      accumulate_wide(ea, eb, sa_all, sb_all, smallest_exponent(fa.element), smallest_exponent(fb.element), kb, k0,
                      width, acc, m, n);
    } else if (!model.tensor_core) {
      // Every partial sum is on the products' grid and within 53 bits (checked above): exact in any order.
      partial.noalias() = ea.middleCols(k0, width) * eb.middleCols(k0, width).transpose();
      for (int i = 0; i < m; ++i) {
        const double sa = sa_all(i, kb);
        float* row = acc.data() + static_cast<std::size_t>(i) * n;
        for (int j = 0; j < n; ++j) {
          // P sa sb is exact (power-of-two or 4-bit scales); acc + it rounded once to binary32.
          // + 0.0: a zero partial is +0, as an accumulator that starts from +0 makes it (the product
          // order of Eigen's kernel could otherwise leave -0 from all-negative-zero products).
          const double t = (partial(i, j) + 0.0) * sa * sb_all(j, kb);
          row[j] = static_cast<float>(add_round_to_odd(row[j], t));
        }
      }
    } else {
      // The partials of this block through the tensor-core GEMM (accumulation.hpp; its vector kernel).
      std::vector<float> x(static_cast<std::size_t>(m) * width), y(static_cast<std::size_t>(width) * n);
      std::vector<float> p(static_cast<std::size_t>(m) * n);
      for (int i = 0; i < m; ++i)
        for (int t = 0; t < width; ++t) x[static_cast<std::size_t>(i) * width + t] = static_cast<float>(ea(i, k0 + t));
      for (int t = 0; t < width; ++t)
        for (int j = 0; j < n; ++j) y[static_cast<std::size_t>(t) * n + j] = static_cast<float>(eb(j, k0 + t));
      AccumulationModel tc;
      tc.kind = AccumulationKind::tensor_core;
      tc.tensor_core = *model.tensor_core;
      tc.tensor_core.input = joint_input(*model.tensor_core, fa.element, fb.element);
      tc.format = model.tensor_core->output;
      tc.mode = model.tensor_core->rounding;
      gemm(tc, x.data(), y.data(), p.data(), m, n, width, false, 1);
      for (int i = 0; i < m; ++i) {
        const auto sa = static_cast<float>(sa_all(i, kb));
        float* row = acc.data() + static_cast<std::size_t>(i) * n;
        const float* partials = p.data() + static_cast<std::size_t>(i) * n;
        for (int j = 0; j < n; ++j) {
          const float scale = sa * static_cast<float>(sb_all(j, kb));
          row[j] = std::fma(partials[j], scale, row[j]);  // DeepGEMM's acc += scale * partial: one FFMA
        }
      }
    }
  }
  write_output(acc, a, bt, c, accumulate_c);
}

}  // namespace mpsim
