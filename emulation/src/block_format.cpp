#include "mpsim/emulation/block_format.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "mpsim/emulation/pattern_format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/random_draw.hpp"
#include "mpsim/emulation/block_scaling.hpp"
#include "emulation/src/quantize_kernel.hpp"

namespace mpsim {
namespace {

// NVFP4's rules: a per-tensor scale over the block scales (its first pass finds the tensor's amax).
bool two_level(ScaleRule rule) { return rule == ScaleRule::nvfp4 || rule == ScaleRule::nvfp4_te; }

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// OCP MX v1.0 §5.3: elements saturate. E5M2's preset overflows to infinity,
// so MXFP8 E5M2 uses its saturating variant.
constexpr Format kE5m2Saturating{5, 2, Subnormals::gradual, Overflow::saturate};

ElementFormat floating(Format f) { return {f, 0, 0}; }
ElementFormat integer(int bits, int fraction_bits) { return {std::nullopt, bits, fraction_bits}; }

struct Preset {
  std::string_view name;
  BlockFormat format;
};
const Preset kPresets[] = {
    {"mxfp8-e4m3", {floating(formats::e4m3), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"mxfp8-e5m2", {floating(kE5m2Saturating), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"mxfp6-e3m2", {floating(formats::e3m2), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"mxfp6-e2m3", {floating(formats::e2m3), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"mxfp4", {floating(formats::e2m1), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"mxint8", {integer(8, 6), 1, 32, ScaleFormat::e8m0, ScaleRule::ocp_floor}},
    {"nvfp4", {floating(formats::e2m1), 1, 16, ScaleFormat::ue4m3, ScaleRule::nvfp4}},
    // The NVFP4 recipe's weights: 16 x 16 tiles, so that a weight's forward and
    // data-gradient GEMMs (k along its columns, then its rows) read the same
    // values (arXiv 2509.25149, §4.3).
    {"nvfp4-16x16", {floating(formats::e2m1), 16, 16, ScaleFormat::ue4m3, ScaleRule::nvfp4}},
    {"fp8-e4m3-1x128", {floating(formats::e4m3), 1, 128, ScaleFormat::binary32, ScaleRule::amax_over_max}},
    {"fp8-e4m3-128x128", {floating(formats::e4m3), 128, 128, ScaleFormat::binary32, ScaleRule::amax_over_max}},
    // One binary32 scale amax / largest for the whole tensor (block 0 x 0):
    // Transformer Engine's per-tensor current scaling, E4M3 and E5M2.
    {"fp8-e4m3-tensor", {floating(formats::e4m3), 0, 0, ScaleFormat::binary32, ScaleRule::amax_over_max}},
    {"fp8-e5m2-tensor", {floating(kE5m2Saturating), 0, 0, ScaleFormat::binary32, ScaleRule::amax_over_max}},
    {"int8", {integer(8, 0), 1, 32, ScaleFormat::binary32, ScaleRule::amax_over_max}},
    {"int4", {integer(4, 0), 1, 32, ScaleFormat::binary32, ScaleRule::amax_over_max}},
};

constexpr std::pair<ScaleRule, std::string_view> kRuleNames[] = {
    {ScaleRule::ocp_floor, "floor"},  {ScaleRule::ceil, "ceil"}, {ScaleRule::nvfp4, "nvfp4"},
    {ScaleRule::nvfp4_te, "nvfp4-te"}, {ScaleRule::amax_over_max, "amax-over-max"}};

// An element rounded: its code, its exact value, and whether it saturated.
struct Element {
  std::uint32_t code = 0;
  double value = 0;
  bool saturated = false;
};

// Symmetric integers k * 2^-f, |k| <= 2^(bits-1) - 1: y * 2^f rounded to an
// integer in the mode (every step exact in binary64: |y * 2^f| < 2^53 where it
// matters, and larger values saturate anyway), then clamped. Zero has no sign.
Element round_integer(const ElementFormat& e, Rounding r, double y, std::uint32_t draw) {
  const double limit = std::ldexp(1.0, e.integer_bits - 1) - 1;
  const double q = std::ldexp(y, e.fraction_bits);
  const double a = std::fabs(q);
  Element out;
  double k = 0;
  if (a >= std::ldexp(1.0, 53)) {
    k = limit + 1;  // saturates below
  } else {
    const double down = std::floor(a), rest = a - down;  // exact
    bool up = false;
    switch (r.mode) {
      case RoundingMode::nearest_even: up = rest > 0.5 || (rest == 0.5 && std::fmod(down, 2) != 0); break;
      case RoundingMode::nearest_away: up = rest >= 0.5; break;
      case RoundingMode::toward_zero: break;
      case RoundingMode::toward_positive: up = rest > 0 && q > 0; break;
      case RoundingMode::toward_negative: up = rest > 0 && q < 0; break;
      case RoundingMode::odd: up = rest > 0 && std::fmod(down, 2) == 0; break;
      case RoundingMode::stochastic: {
        // rest as a 0.32 fraction, cut to random_bits, plus the draw: up on a carry (rounding.cpp's rule).
        const auto fraction = static_cast<std::uint32_t>(std::ldexp(rest, 32));  // exact: rest has < 53 bits
        const std::uint32_t keep = ~std::uint32_t{0} << (32 - r.random_bits);
        up = std::uint64_t{fraction & keep} + (draw & keep) > 0xFFFFFFFFu;
        break;
      }
    }
    k = down + (up ? 1 : 0);
  }
  if (k > limit) {
    k = limit;
    out.saturated = true;
  }
  const double signed_k = q < 0 && k != 0 ? -k : k;  // no -0: the code could not hold it
  out.value = std::ldexp(signed_k, -e.fraction_bits);
  const auto as_int = static_cast<std::int64_t>(signed_k);
  out.code = static_cast<std::uint32_t>(as_int) & ((std::uint32_t{1} << e.integer_bits) - 1);
  return out;
}

Element round_element(const ElementFormat& e, Rounding r, double y, std::uint32_t draw) {
  if (!e.floating) return round_integer(e, r, y, draw);
  const Rounded rounded = round_to_format(*e.floating, r, y, draw);
  return {static_cast<std::uint32_t>(rounded.bits.value), to_double(*e.floating, rounded.bits),
          rounded.flags.has(Flags::overflow)};
}

struct BlockSpan {
  std::int64_t row0, rows, col0, cols;
};

template <class F>
void for_each(const BlockSpan& b, std::int64_t stride, F f) {
  for (std::int64_t r = b.row0; r < b.row0 + b.rows; ++r)
    for (std::int64_t c = b.col0; c < b.col0 + b.cols; ++c) f(r * stride + c);
}

// A NaN block: every value NaN, element codes 0 (the scale carries the NaN).
void make_nan(BlockQuantized& q, const BlockSpan& b, std::int64_t stride, BlockCounts& counts) {
  for_each(b, stride, [&](std::int64_t i) {
    q.values[i] = kNan;
    q.elements[i] = 0;
    ++counts.nan;
  });
}

class Quantizer {
 public:
  Quantizer(const BlockFormat& f, std::span<const float> x, std::int64_t rows, std::int64_t cols,
            const BlockQuantizeOptions& o)
      : f_(f), x_(x), rows_(rows), cols_(cols), o_(o), key_(make_draw_key(o.key)) {}

  BlockQuantized run() {
    q_.values.assign(x_.size(), 0);
    q_.elements.assign(x_.size(), 0);
    const std::int64_t grid_rows = (rows_ + f_.block_rows - 1) / f_.block_rows;
    const std::int64_t grid_cols = (cols_ + f_.block_cols - 1) / f_.block_cols;
    const bool nvfp4 = two_level(f_.rule);
    if (nvfp4) prepare_tensor_scale();
    for (std::int64_t br = 0; br < grid_rows; ++br) {
      for (std::int64_t bc = 0; bc < grid_cols; ++bc) {
        const BlockSpan b{br * f_.block_rows, std::min<std::int64_t>(f_.block_rows, rows_ - br * f_.block_rows),
                          bc * f_.block_cols, std::min<std::int64_t>(f_.block_cols, cols_ - bc * f_.block_cols)};
        BlockCounts counts;
        counts.elements = static_cast<std::uint64_t>(b.rows * b.cols);
        for_each(b, cols_, [&](std::int64_t i) { counts.nonzero += std::isfinite(x_[i]) && x_[i] != 0; });
        if (nvfp4) nvfp4_block(b, counts);
        else if (f_.rule == ScaleRule::amax_over_max) amax_over_max_block(b, counts);
        else power_of_two_block(b, counts);
        q_.counts += counts;
        q_.block_counts.push_back(counts);
      }
    }
    return std::move(q_);
  }

 private:
  std::uint32_t draw(std::int64_t i) const {
    return o_.rounding.mode == RoundingMode::stochastic ? random_draw(key_, o_.first_index + static_cast<std::uint64_t>(i)) : 0;
  }

  // Rounds x[i] / scale (given as the exact quotient y), records the element and
  // the value element * dequantize (exact in binary64).
  void put(std::int64_t i, double y, double dequantize, BlockCounts& counts) {
    const Element e = round_element(f_.element, o_.rounding, y, draw(i));
    q_.elements[i] = e.code;
    q_.values[i] = e.value * dequantize;
    counts.saturated += e.saturated;
    counts.flushed += std::isfinite(x_[i]) && x_[i] != 0 && e.value == 0;
  }

  void push_scale(std::uint32_t code, double value) {
    q_.scale_codes.push_back(code);
    q_.scales.push_back(value);
  }

  // Whether the block holds a NaN, and an infinity; its largest magnitude.
  struct Scan {
    bool nan = false, infinite = false;
    float amax = 0;
  };
  Scan scan(const BlockSpan& b) const {
    Scan s;
    for_each(b, cols_, [&](std::int64_t i) {
      const float a = std::fabs(x_[i]);
      if (std::isnan(a)) s.nan = true;
      else if (std::isinf(a)) s.infinite = true;
      else s.amax = std::max(s.amax, a);
    });
    return s;
  }

  // OCP MX: a power-of-two scale from amax's exact exponent (floor), or the
  // smallest one that keeps amax within the largest element (ceil).
  void power_of_two_block(const BlockSpan& b, BlockCounts& counts) {
    const Scan s = scan(b);
    if (s.nan || s.infinite) {  // OCP MX §6.3: the scale is NaN, and so is every value of the block
      push_scale(kE8m0Nan, kNan);
      make_nan(q_, b, cols_, counts);
      return;
    }
    int e = -127;  // an all-zero block: the smallest scale
    if (s.amax > 0) {
      e = std::ilogb(s.amax) - f_.element.emax();  // exact, subnormal amax included
      if (f_.rule == ScaleRule::ceil && std::ldexp(static_cast<double>(s.amax), -e) > f_.element.largest()) ++e;
      if (e < -127 || e > 127) {
        e = std::clamp(e, -127, 127);
        counts.scale_clamped = 1;
      }
    }
    push_scale(static_cast<std::uint32_t>(e + 127), std::ldexp(1.0, e));
    const double scale = std::ldexp(1.0, e);
    for_each(b, cols_, [&](std::int64_t i) { put(i, std::ldexp(static_cast<double>(x_[i]), -e), scale, counts); });
  }

  // DeepSeek-V3: s = amax / largest in binary32, y = x / s in binary32.
  void amax_over_max_block(const BlockSpan& b, BlockCounts& counts) {
    const Scan sc = scan(b);
    if (sc.nan) {
      push_scale(std::bit_cast<std::uint32_t>(std::numeric_limits<float>::quiet_NaN()), kNan);
      make_nan(q_, b, cols_, counts);
      return;
    }
    if (sc.infinite) {  // s = inf: x / s is 0 or NaN; every value NaN
      push_scale(std::bit_cast<std::uint32_t>(std::numeric_limits<float>::infinity()),
                 std::numeric_limits<double>::infinity());
      make_nan(q_, b, cols_, counts);
      return;
    }
    const float s = sc.amax / static_cast<float>(f_.element.largest());
    push_scale(std::bit_cast<std::uint32_t>(s), s);
    if (s == 0 && sc.amax > 0) counts.scale_clamped = 1;  // amax / largest underflowed binary32
    for_each(b, cols_, [&](std::int64_t i) {
      if (s == 0 && x_[i] == 0) {  // an all-zero tile: zeros with their signs
        put(i, static_cast<double>(x_[i]), 1.0, counts);
        return;
      }
      const float y = x_[i] / s;
      put(i, y, s, counts);
    });
  }

  // NVFP4: the per-tensor encode scale S_enc = 2688 / amax (6 * 448), then per
  // block sb = E4M3(min((amax_b / 6) * S_enc, 448)), every step one binary32
  // operation rounded to nearest even, in the order of arXiv 2509.25149.
  void prepare_tensor_scale() {
    tensor_nan_ = std::any_of(x_.begin(), x_.end(), [](float v) { return std::isnan(v); });
    float amax = 0;
    for (float v : x_) amax = std::max(amax, std::fabs(v));
    encode_ = 1.0f;
    if (amax > 0 && std::isfinite(amax)) {
      encode_ = 2688.0f / amax;
      if (std::isinf(encode_)) encode_ = FLT_MAX;
    }
    tensor_scale_ = 1.0f / encode_;
    q_.tensor_scale = tensor_nan_ ? kNan : tensor_scale_;
  }

  void nvfp4_block(const BlockSpan& b, BlockCounts& counts) {
    if (tensor_nan_) {  // any NaN makes the whole tensor NaN
      push_scale(kUe4m3Nan, kNan);
      make_nan(q_, b, cols_, counts);
      return;
    }
    float amax = 0;
    for_each(b, cols_, [&](std::int64_t i) { amax = std::max(amax, std::fabs(x_[i])); });
    float s = 0;
    if (f_.rule == ScaleRule::nvfp4) {
      const float sixth = amax / 6.0f;
      s = sixth * encode_;
    } else {  // Transformer Engine: amax_b * (S_enc * (1/6))
      const float one_sixth = 1.0f / 6.0f;
      const float factor = encode_ * one_sixth;
      s = amax * factor;
    }
    if (std::isinf(s)) s = FLT_MAX;
    if (s > 448.0f) {
      s = 448.0f;
      counts.scale_clamped = 1;
    }
    const Rounded sb_code = round_to_scale(ScaleFormat::ue4m3, Rounding{RoundingMode::nearest_even}, s);
    const auto sb = static_cast<float>(scale_value(ScaleFormat::ue4m3, static_cast<std::uint32_t>(sb_code.bits.value)));
    if (sb == 0 && amax > 0) counts.scale_clamped = 1;  // the block scale underflowed UE4M3
    push_scale(static_cast<std::uint32_t>(sb_code.bits.value), sb);
    const float product = sb * tensor_scale_;
    float enc = 1.0f / product;
    if (std::isinf(enc)) enc = FLT_MAX;
    const double dequantize = static_cast<double>(sb) * static_cast<double>(tensor_scale_);  // exact: 4 x 24 bits
    for_each(b, cols_, [&](std::int64_t i) {
      const float y = x_[i] * enc;
      put(i, y, dequantize, counts);
    });
  }

  const BlockFormat& f_;
  std::span<const float> x_;
  std::int64_t rows_, cols_;
  const BlockQuantizeOptions& o_;
  DrawKey key_;
  BlockQuantized q_;
  bool tensor_nan_ = false;
  float encode_ = 1, tensor_scale_ = 1;
};

// --- The fast path -------------------------------------------------------------------
// NVFP4's tensor scale first, 2-D tiles' scales next (they span rows), then
// one fused vector pass over the tensor in memory order (quantize_kernel.hpp),
// which finds 1 x N blocks' scales itself (NVFP4's from the amaxes its first
// pass kept) with block_scaling.hpp's binary32 operations, the reference's. y = x op scale is the reference's y exactly:
// for the MX formats x * 2^-e is exact unless it falls below binary32's normal
// range, where it is far below the element's smallest subnormal (2^-16 at
// most): nearest-even and stochastic rounding (its 32-bit fraction is then 0)
// give zero either way.
using detail::BlockKind;

class FastQuantizer {
 public:
  // `out` (dequantized values) and `elements` are written where not null.
  FastQuantizer(const BlockFormat& f, std::span<const float> x, float* out, float* elements, std::int64_t rows,
                std::int64_t cols, const BlockQuantizeOptions& o)
      : f_(f), x_(x), out_(out), elements_(elements), rows_(rows), cols_(cols), o_(o),
        grid_rows_((rows + f.block_rows - 1) / f.block_rows), grid_cols_((cols + f.block_cols - 1) / f.block_cols) {}

  BlockSummary run() {
    const auto blocks = static_cast<std::size_t>(grid_rows_ * grid_cols_);
    // NVFP4's first pass reads the whole tensor for its amax, a pass limited by memory: it also keeps each
    // 1 x N block's amax, in its code's place (the second pass reads it before writing the code), and counts
    // x's zeros, work the second pass, limited by its arithmetic, then skips (bench_quantize --blocks, 16M
    // floats, AVX-512 AMD EPYC VM, 2026-11-28: stochastic 0.47x memcpy -> 0.52-0.56x; on the AVX2 code,
    // nearest-even 0.35-0.39x -> 0.52-0.53x).
    block_amax_ = two_level(f_.rule) && f_.block_rows == 1 && !x_.empty();
    if (f_.block_rows == 1) summary_.scale_codes.resize(blocks);
    if (block_amax_) {
      const auto block = static_cast<std::size_t>(f_.block_cols);
      std::uint32_t m = 0;
      if (cols_ % f_.block_cols == 0) {  // no block straddles rows: the tensor as one row
        m = detail::block_amax_bits(x_.data(), x_.size(), block, summary_.scale_codes.data(), zeros_);
      } else {
        for (std::int64_t r = 0; r < rows_; ++r) {
          std::uint64_t zeros = 0;
          m = std::max(m, detail::block_amax_bits(x_.data() + r * cols_, static_cast<std::size_t>(cols_), block,
                                                  summary_.scale_codes.data() + r * grid_cols_, zeros));
          zeros_ += zeros;
        }
      }
      rule_ = detail::block_rule(f_, m);
    } else {
      rule_ = detail::block_rule(f_, x_);
    }
    if (rule_.kind == BlockKind::nvfp4) summary_.tensor_scale = rule_.tensor_nan ? kNan : rule_.tensor_scale;
    if (f_.block_rows > 1) {
      summary_.scale_codes.reserve(blocks);
      // 2-D tiles: a tile's scale spans rows, so every scale first; then each row with its tiles' scales.
      params_.reserve(static_cast<std::size_t>(grid_rows_ * grid_cols_));
      for (std::int64_t br = 0; br < grid_rows_; ++br)
        for (std::int64_t bc = 0; bc < grid_cols_; ++bc) {
          params_.push_back(detail::block_params(rule_, tile_amax_bits(br, bc)));
          summary_.scale_codes.push_back(params_.back().code);
          summary_.counts.scale_clamped += params_.back().clamped;
        }
    }
    quantize_rows();
    summary_.counts.elements = x_.size();
    return std::move(summary_);
  }

 private:
  // A 2-D tile's largest magnitude as binary32 bits, row by row.
  std::uint32_t tile_amax_bits(std::int64_t br, std::int64_t bc) const {
    std::uint32_t m = 0;
    const std::int64_t c0 = bc * f_.block_cols, c1 = std::min(cols_, c0 + f_.block_cols);
    for (std::int64_t r = br * f_.block_rows; r < std::min(rows_, (br + 1) * f_.block_rows); ++r)
      m = std::max(m, detail::amax_bits(x_.data() + r * cols_ + c0, static_cast<std::size_t>(c1 - c0)));
    return m;
  }

  // Every row through the fused kernel (quantize_kernel.hpp) in runs of whole
  // blocks, one pass over the data; 1 x N blocks find their own scales, a row
  // of 2-D tiles takes theirs from params_.
  void quantize_rows() {
    // The runs that left x's zeros to us (zeros_uncounted): all of them or none (one rule, kernel and
    // block_amax_ for the tensor).
    std::uint64_t looked = 0, zero_elements = 0, runs = 0, uncounted_runs = 0;
    QuantizeOptions q;
    q.rounding = o_.rounding;
    q.stochastic = {o_.key, 0};
    // Integer elements (MXINT8, int8, int4) round on the integer grid's pattern format (integer_pattern_format).
    const detail::KernelFor<float> kernel =
        f_.element.floating ? detail::make_kernel<float>(*f_.element.floating, q)
                            : detail::make_integer_kernel(f_.element.integer_bits, f_.element.fraction_bits, q);
    const std::size_t block = static_cast<std::size_t>(f_.block_cols);
    const std::size_t per_run = std::max<std::size_t>(1, (std::size_t{1} << 20) / block);  // lane counters < 2^28
    for (std::int64_t r = 0; r < rows_; ++r) {
      for (std::int64_t b0 = 0; b0 < grid_cols_; b0 += static_cast<std::int64_t>(per_run)) {
        const std::int64_t b1 = std::min(grid_cols_, b0 + static_cast<std::int64_t>(per_run));
        const std::size_t first = static_cast<std::size_t>(r * cols_ + b0 * f_.block_cols);
        const std::size_t n = static_cast<std::size_t>(std::min(cols_, b1 * f_.block_cols) - b0 * f_.block_cols);
        const Params* given =
            params_.empty() ? nullptr : params_.data() + static_cast<std::size_t>(r / f_.block_rows * grid_cols_ + b0);
        // 1 x N blocks write their codes in place (over their amax where block_amax_); tiles' were written
        // in run().
        std::uint32_t* codes = given == nullptr ? summary_.scale_codes.data() + r * grid_cols_ + b0 : nullptr;
        detail::BlockKernelCounts counts;
        detail::quantize_blocks_vector(kernel, rule_, given, x_.data() + first, out_ ? out_ + first : nullptr,
                                       elements_ ? elements_ + first : nullptr, n, block, o_.first_index + first,
                                       block_amax_ ? codes : nullptr, codes, counts);
        ++runs;
        if (counts.zeros_uncounted) {
          ++uncounted_runs;
          looked += counts.nonzero;
          zero_elements += counts.lost;
          counts.nonzero = counts.lost = 0;
        }
        summary_.counts.nonzero += counts.nonzero;
        summary_.counts.flushed += counts.flushed + counts.lost;
        summary_.counts.saturated += counts.saturated;
        summary_.counts.nan += counts.nan;
        summary_.counts.scale_clamped += counts.clamped;
      }
    }
    if (uncounted_runs > 0) {  // x's zeros and the padding lanes
      if (uncounted_runs != runs) throw std::logic_error("quantize_blocks: some runs counted x's zeros, some not");
      const std::uint64_t padding = looked - x_.size();
      summary_.counts.nonzero += x_.size() - zeros_;
      summary_.counts.flushed += zero_elements - zeros_ - padding;
    }
  }

  using Params = detail::BlockParams;
  const BlockFormat& f_;
  std::span<const float> x_;
  float* out_;
  float* elements_;
  std::int64_t rows_, cols_;
  const BlockQuantizeOptions& o_;
  std::int64_t grid_rows_, grid_cols_;
  detail::BlockRule rule_;
  bool block_amax_ = false;     // summary_.scale_codes holds each block's amax until its code replaces it
  std::uint64_t zeros_ = 0;     // with block_amax_: the zeros of x
  std::vector<Params> params_;  // 2-D tiles only
  BlockSummary summary_;
};

void check_shape(const BlockFormat& format, std::size_t size, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<std::uint64_t>(rows * cols) != size)
    throw std::invalid_argument("quantize_blocks: a " + std::to_string(rows) + " x " + std::to_string(cols) +
                                " tensor needs " + std::to_string(rows * cols) + " values, got " + std::to_string(size));
  if ((format.block_rows < 1 || format.block_cols < 1) && (format.block_rows != 0 || format.block_cols != 0))
    throw std::invalid_argument("quantize_blocks: block shape " + std::to_string(format.block_rows) + "x" +
                                std::to_string(format.block_cols) + " must be at least 1x1, or 0x0 for the whole tensor");
  if (!format.element.floating && (format.element.integer_bits < 2 || format.element.integer_bits > 16))
    throw std::invalid_argument("quantize_blocks: integer elements need 2..16 bits");
  if (format.element.floating && !fits_in_float(*format.element.floating))
    throw std::invalid_argument("quantize_blocks: element format " + format.element.name() + " does not fit in binary32");
}

}  // namespace

double ElementFormat::largest() const {
  if (floating) return floating->largest_finite();
  return std::ldexp(std::ldexp(1.0, integer_bits - 1) - 1, -fraction_bits);
}

int ElementFormat::emax() const { return floating ? floating->emax() : std::ilogb(largest()); }

std::string ElementFormat::name() const {
  if (floating) return floating->name();
  std::string text = "int" + std::to_string(integer_bits);
  if (fraction_bits != 0) text += ":f" + std::to_string(fraction_bits);
  return text;
}

std::string_view to_string(ScaleRule rule) {
  for (const auto& [r, name] : kRuleNames)
    if (r == rule) return name;
  return "?";
}

std::optional<ScaleRule> parse_scale_rule(std::string_view text) {
  for (const auto& [r, name] : kRuleNames)
    if (text == name) return r;
  return std::nullopt;
}

std::string BlockFormat::name() const {
  for (const Preset& p : kPresets)
    if (p.format == *this) return std::string(p.name);
  return element.name() + " " + std::to_string(block_rows) + "x" + std::to_string(block_cols) + " " +
         std::string(to_string(scale)) + " " + std::string(to_string(rule));
}

std::optional<BlockFormat> parse_block_format(std::string_view name) {
  for (const Preset& p : kPresets)
    if (p.name == name) return p.format;
  return std::nullopt;
}

std::string_view block_format_names() {
  return "mxfp8-e4m3, mxfp8-e5m2, mxfp6-e3m2, mxfp6-e2m3, mxfp4, mxint8 (OCP MX v1.0: blocks of 32, E8M0 scales), "
         "nvfp4 (E2M1, blocks of 16, UE4M3 scales, binary32 tensor scale), nvfp4-16x16 (the same in 16 x 16 tiles), "
         "fp8-e4m3-1x128, fp8-e4m3-128x128 (DeepSeek-V3 tiles, binary32 scale amax/448), fp8-e4m3-tensor, "
         "fp8-e5m2-tensor (one binary32 scale amax/largest per tensor), int8, int4 (symmetric, blocks of 32, binary32 scale amax/127 "
         "or amax/7)";
}

BlockCounts& BlockCounts::operator+=(const BlockCounts& o) {
  elements += o.elements;
  nonzero += o.nonzero;
  saturated += o.saturated;
  flushed += o.flushed;
  nan += o.nan;
  scale_clamped += o.scale_clamped;
  return *this;
}

namespace detail {

BlockRule block_rule(const BlockFormat& f, std::span<const float> tensor) {
  return block_rule(f, two_level(f.rule) && !tensor.empty() ? amax_bits(tensor.data(), tensor.size()) : 0u);
}

BlockRule block_rule(const BlockFormat& f, std::uint32_t tensor_amax_bits) {
  BlockRule rule{two_level(f.rule) ? BlockKind::nvfp4
                 : f.rule == ScaleRule::amax_over_max                        ? BlockKind::tile
                                                                             : BlockKind::power_of_two,
                 f.rule == ScaleRule::ceil, f.rule == ScaleRule::nvfp4_te, f.element.emax(),
                 static_cast<float>(f.element.largest()), 1, 1, false, false, binary32_pattern_format(formats::e4m3),
                 !f.element.floating};
  if (rule.kind != BlockKind::nvfp4) return rule;
  // NVFP4's tensor scale (arXiv 2509.25149): S_enc = 2688 / amax, at most
  // FLT_MAX, 1 when amax is 0 or infinite; any NaN makes the tensor NaN.
  const std::uint32_t m = tensor_amax_bits;
  const float amax = std::bit_cast<float>(m);
  float encode = 1.0f;
  if (amax > 0 && std::isfinite(amax)) {
    encode = 2688.0f / amax;
    if (std::isinf(encode)) encode = FLT_MAX;
  }
  rule.encode = encode;
  rule.tensor_scale = 1.0f / encode;
  rule.tensor_nan = m > 0x7F800000u;
  rule.tensor_finite = m < 0x7F800000u;
  return rule;
}

PatternFormat<std::uint32_t> element_pattern_format(const ElementFormat& e) {
  return e.floating ? binary32_pattern_format(*e.floating) : integer_pattern_format(e.integer_bits, e.fraction_bits);
}

}  // namespace detail

BlockFormat BlockFormat::for_shape(std::int64_t rows, std::int64_t cols) const {
  BlockFormat f = *this;
  if (f.block_rows == 0 && f.block_cols == 0) {
    f.block_rows = static_cast<int>(std::clamp<std::int64_t>(rows, 1, std::numeric_limits<int>::max()));
    f.block_cols = static_cast<int>(std::clamp<std::int64_t>(cols, 1, std::numeric_limits<int>::max()));
  }
  return f;
}

BlockQuantized quantize_blocks(const BlockFormat& format_in, std::span<const float> values, std::int64_t rows,
                               std::int64_t cols, const BlockQuantizeOptions& options) {
  check_shape(format_in, values.size(), rows, cols);
  const BlockFormat format = format_in.for_shape(rows, cols);
  return Quantizer(format, values, rows, cols, options).run();
}

BlockSummary quantize_blocks(const BlockFormat& format_in, std::span<const float> in, std::span<float> out,
                             std::int64_t rows, std::int64_t cols, const BlockQuantizeOptions& options) {
  check_shape(format_in, in.size(), rows, cols);
  const BlockFormat format = format_in.for_shape(rows, cols);
  if (out.size() != in.size())
    throw std::invalid_argument("quantize_blocks: input has " + std::to_string(in.size()) + " values but output has " +
                                std::to_string(out.size()));
  if (options.rounding.mode != RoundingMode::nearest_even && options.rounding.mode != RoundingMode::stochastic)
    throw std::invalid_argument("quantize_blocks: elements round to nearest-even or stochastic, not " +
                                std::string(to_string(options.rounding.mode)));
  // In place is safe: pass 1 reads everything first, pass 2 writes an element only after reading it.
  return FastQuantizer(format, in, out.data(), nullptr, rows, cols, options).run();
}

BlockOperand to_block_operand(const BlockFormat& format, const BlockQuantized& q) {
  BlockOperand o;
  o.elements.resize(q.elements.size());
  const ElementFormat& e = format.element;
  const int bits = e.floating ? e.floating->total_bits() : e.integer_bits;
  for (std::size_t i = 0; i < q.elements.size(); ++i) {
    const std::uint32_t code = q.elements[i];
    double value = 0;
    if (std::isnan(q.values[i])) {
      value = kNan;
    } else if (e.floating) {
      value = to_double(*e.floating, Bits{code});
    } else {  // two's complement of integer_bits
      const auto raw = static_cast<std::int32_t>(code << (32 - bits)) >> (32 - bits);
      value = std::ldexp(static_cast<double>(raw), -e.fraction_bits);
    }
    o.elements[i] = static_cast<float>(value);  // exact: every element format fits in binary32
  }
  o.scale_codes = q.scale_codes;
  o.scales = q.scales;
  o.tensor_scale = q.tensor_scale;
  o.counts = q.counts;
  return o;
}

BlockOperand quantize_block_operand(const BlockFormat& format_in, std::span<const float> in, std::int64_t rows,
                                    std::int64_t cols, const BlockQuantizeOptions& options) {
  check_shape(format_in, in.size(), rows, cols);
  const BlockFormat format = format_in.for_shape(rows, cols);
  if (options.rounding.mode != RoundingMode::nearest_even && options.rounding.mode != RoundingMode::stochastic)
    return to_block_operand(format, quantize_blocks(format, in, rows, cols, options));  // the reference's path
  std::vector<float> elements(in.size());
  BlockSummary s = FastQuantizer(format, in, nullptr, elements.data(), rows, cols, options).run();
  return to_block_operand(format, std::move(s), std::move(elements));
}

BlockOperand to_block_operand(const BlockFormat& format, BlockSummary summary, std::vector<float> elements) {
  BlockOperand o;
  o.elements = std::move(elements);
  o.scales.reserve(summary.scale_codes.size());
  for (const std::uint32_t code : summary.scale_codes) o.scales.push_back(scale_value(format.scale, code));
  o.scale_codes = std::move(summary.scale_codes);
  o.tensor_scale = summary.tensor_scale;
  o.counts = summary.counts;
  return o;
}

}  // namespace mpsim
