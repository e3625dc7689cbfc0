// Vector kernel: binary32 -> format -> binary32, on the bit pattern, with
// Highway's run-time dispatch (one binary, the best target of each CPU).
//
// Why integer rounding on the pattern works. A positive binary32 pattern
// a = (e << 23) | f has the value (2^23 + f) * 2^(e-150) for e >= 1 and
// f * 2^-149 for e = 0. Let eff = max(e, 1) and M = a - ((eff-1) << 23): M is
// the significand with its hidden bit (< 2^24), and value = M * 2^(eff-150).
// The format's quantum at this value is 2^(eff-150+s) with
//   s = (23 - mantissa bits) + max(0, emin' - eff)     (gradual underflow)
// where emin' is the format's emin as a biased binary32 exponent. Rounding M to
// a multiple of 2^s and adding back (eff-1) << 23 gives the rounded pattern;
// a carry out of the significand lands in the exponent field, which is exactly
// the next binade. When s >= 24 the value is below half... of one quantum in
// magnitude order: the result is 0 or the smallest subnormal. Overflow is a
// pattern compare against the largest finite value. Rounding never goes
// through an intermediate format: one step, as the scalar reference does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "emulation/src/quantize_vector.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <algorithm>
#include <cstring>

#include "emulation/src/quantize_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace mpsim::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<std::uint32_t>;
using V = hn::Vec<D>;

struct Counters {
  V inexact, flushed, subnormal, overflow, nan;
};

// Counts lanes where `mask` holds (mask lanes are all ones: subtracting adds 1).
HWY_INLINE void Count(D d, V& counter, hn::Mask<D> mask) { counter = hn::Sub(counter, hn::VecFromMask(d, mask)); }

template <RoundingMode kMode>
HWY_INLINE V QuantizeLanes(D d, const Float32Kernel& k, V x, V draw, hn::Mask<D> valid, Counters& c) {
  const V sign = hn::And(x, hn::Set(d, 0x80000000u));
  const V a = hn::And(x, hn::Set(d, 0x7FFFFFFFu));
  const V inf = hn::Set(d, 0x7F800000u);
  const auto is_nan = hn::Gt(a, inf);
  const auto is_inf = hn::Eq(a, inf);

  const V one = hn::Set(d, 1u);
  const V eff = hn::Max(hn::ShiftRight<23>(a), one);
  const V significand = hn::Sub(a, hn::ShiftLeft<23>(hn::Sub(eff, one)));
  V s = hn::Set(d, k.base_shift);
  if (!k.flush_to_zero) {
    const V emin = hn::Set(d, k.min_normal_exponent);
    s = hn::Add(s, hn::Sub(hn::Max(emin, eff), eff));  // + max(0, emin - eff)
  } else if (k.base_shift > 0) {
    // Flush to zero decides tininess by rounding with an unbounded exponent
    // (IEEE 754 §7.5). Below 2^-126 the pattern's exponent field no longer
    // shows the binade: [2^-127, 2^-126) needs a quantum one binade finer, the
    // only binade from which rounding can still reach 2^-126.
    s = hn::Sub(s, hn::IfThenElseZero(hn::Lt(a, hn::Set(d, 0x00800000u)), one));
  }
  const V s_clamped = hn::Min(s, hn::Set(d, 31u));  // s >= 24 already means "below one quantum"
  const V low_mask = hn::Sub(one << s_clamped, one);
  V q = significand >> s_clamped;
  const V rest = hn::And(significand, low_mask);
  const auto inexact_rounding = hn::Ne(rest, hn::Zero(d));
  const auto negative = hn::Ne(sign, hn::Zero(d));

  hn::Mask<D> up;
  if constexpr (kMode == RoundingMode::nearest_even || kMode == RoundingMode::nearest_away) {
    const V half = hn::ShiftRight<1>(one << s_clamped);
    const auto above_half = hn::Gt(rest, half);
    const auto at_half = hn::And(hn::Eq(rest, half), inexact_rounding);
    if constexpr (kMode == RoundingMode::nearest_even) {
      up = hn::Or(above_half, hn::And(at_half, hn::Ne(hn::And(q, one), hn::Zero(d))));
    } else {
      up = hn::Or(above_half, at_half);
    }
  } else if constexpr (kMode == RoundingMode::toward_zero || kMode == RoundingMode::odd) {
    up = hn::FirstN(d, 0);
    if constexpr (kMode == RoundingMode::odd) q = hn::Or(q, hn::IfThenElseZero(inexact_rounding, one));
  } else if constexpr (kMode == RoundingMode::toward_positive) {
    up = hn::AndNot(negative, inexact_rounding);
  } else if constexpr (kMode == RoundingMode::toward_negative) {
    up = hn::And(negative, inexact_rounding);
  } else {  // stochastic: the remainder as a 0.32 fraction of the quantum, plus the draw
    const V thirty_two = hn::Set(d, 32u);
    const auto left = hn::Lt(s, hn::Set(d, 33u));
    const V left_count = hn::Min(hn::Sub(thirty_two, hn::Min(s, thirty_two)), hn::Set(d, 31u));
    const V right_count = hn::Min(hn::Sub(hn::Max(s, thirty_two), thirty_two), hn::Set(d, 31u));
    V fraction = hn::IfThenElse(left, rest << left_count, rest >> right_count);
    // s = 0 (binary32 itself) leaves rest = 0: nothing to add.
    const V random_mask = hn::Set(d, k.random_mask);
    fraction = hn::And(fraction, random_mask);
    const V sum = hn::Add(fraction, hn::And(draw, random_mask));
    up = hn::Lt(sum, fraction);  // carry out of 32 bits
  }
  q = hn::Add(q, hn::IfThenElseZero(up, one));

  // Back to a pattern. Below one quantum (s >= 24) the result is 0 or the
  // smallest subnormal; otherwise the carry flows into the exponent field.
  const auto below_quantum = hn::Gt(s, hn::Set(d, 23u));
  const V regular = hn::Add(hn::ShiftLeft<23>(hn::Sub(eff, one)), q << s_clamped);
  const V tiny_result = hn::IfThenElseZero(hn::Ne(q, hn::Zero(d)), hn::Set(d, k.smallest_subnormal));
  V magnitude = hn::IfThenElse(below_quantum, tiny_result, regular);
  if (k.flush_to_zero) magnitude = hn::IfThenZeroElse(hn::Lt(magnitude, hn::Set(d, k.smallest_normal)), magnitude);

  const auto finite = hn::Lt(a, inf);
  const auto overflow_finite = hn::And(finite, hn::Gt(magnitude, hn::Set(d, k.largest_finite)));
  const auto overflow = k.has_infinity ? overflow_finite : hn::Or(overflow_finite, is_inf);
  const V overflowed = hn::IfThenElse(negative, hn::Set(d, k.overflow_negative), hn::Set(d, k.overflow_positive));
  V result = hn::Or(magnitude, sign);
  result = hn::IfThenElse(overflow, overflowed, result);
  if (k.has_infinity) result = hn::IfThenElse(is_inf, x, result);
  result = hn::IfThenElse(is_nan, hn::Or(hn::And(x, hn::Set(d, k.nan_keep)), hn::Set(d, k.nan_set)), result);

  const V result_magnitude = hn::And(result, hn::Set(d, 0x7FFFFFFFu));
  const auto changed = hn::And(finite, hn::Ne(result_magnitude, a));
  Count(d, c.inexact, hn::And(valid, hn::Or(changed, overflow)));
  Count(d, c.overflow, hn::And(valid, overflow));
  Count(d, c.flushed, hn::And(valid, hn::And(hn::And(finite, hn::Ne(a, hn::Zero(d))),
                                             hn::Eq(result_magnitude, hn::Zero(d)))));
  Count(d, c.subnormal, hn::And(valid, hn::And(hn::Ne(result_magnitude, hn::Zero(d)),
                                               hn::Lt(result_magnitude, hn::Set(d, k.smallest_normal)))));
  Count(d, c.nan, hn::And(valid, hn::Gt(result_magnitude, inf)));
  return result;
}

// The common case, taken when every lane is zero or within [smallest normal,
// largest finite]: no result can be subnormal, flushed, overflowed or NaN, the
// quantum is the same 2^(23-mantissa bits) in every lane, and rounding the
// whole pattern (sign included: no carry can reach it) to a multiple of it is
// the answer. Only the inexact counter can move.
template <RoundingMode kMode>
HWY_INLINE V QuantizeOrdinaryLanes(D d, const Float32Kernel& k, V x, V draw, V& inexact) {
  const V s = hn::Set(d, k.base_shift);
  const V unit = hn::Set(d, 1u) << s;
  const V low = hn::Sub(unit, hn::Set(d, 1u));
  const V truncated = hn::AndNot(low, x);
  V r;
  if constexpr (kMode == RoundingMode::nearest_even) {
    // Add half an ulp minus one, plus the kept last bit: ties go to even.
    // With no mantissa bits the significand is 1, always odd (bit 23 is the exponent's).
    const V parity = k.base_shift == 23 ? hn::Set(d, 1u) : hn::And(x >> s, hn::Set(d, k.base_shift != 0 ? 1u : 0u));
    r = hn::AndNot(low, hn::Add(x, hn::Add(parity, hn::ShiftRight<1>(low))));
  } else if constexpr (kMode == RoundingMode::nearest_away) {
    r = hn::AndNot(low, hn::Add(x, hn::ShiftRight<1>(unit)));
    if (k.base_shift == 0) r = x;
  } else if constexpr (kMode == RoundingMode::toward_zero) {
    r = truncated;
  } else if constexpr (kMode == RoundingMode::toward_positive || kMode == RoundingMode::toward_negative) {
    const auto negative = hn::Lt(hn::BitCast(hn::RebindToSigned<D>(), x), hn::Zero(hn::RebindToSigned<D>()));
    const V away = hn::AndNot(low, hn::Add(x, low));
    const auto take_away = hn::RebindMask(d, negative);
    r = kMode == RoundingMode::toward_positive ? hn::IfThenElse(take_away, truncated, away)
                                               : hn::IfThenElse(take_away, away, truncated);
  } else if constexpr (kMode == RoundingMode::odd) {
    // With no mantissa bits the significand is always 1: already odd.
    r = k.base_shift == 23 ? truncated : hn::Or(truncated, hn::IfThenElseZero(hn::Ne(truncated, x), unit));
  } else {  // stochastic
    const V shift = hn::Set(d, k.base_shift == 0 ? 31u : 32u - k.base_shift);
    const V random_mask = hn::Set(d, k.random_mask);
    const V fraction = hn::And(hn::And(x, low) << shift, random_mask);
    const V sum = hn::Add(fraction, hn::And(draw, random_mask));
    r = hn::Add(truncated, hn::IfThenElseZero(hn::Lt(sum, fraction), unit));
  }
  inexact = hn::Sub(inexact, hn::VecFromMask(d, hn::Ne(r, x)));
  return r;
}

// The keyed hash of rounding.cpp's random_draw, on lanes of consecutive indices
// whose high word is the same (the caller splits at multiples of 2^32).
HWY_INLINE V Draws(D d, const Float32Kernel& k, V low_words, V high_term) {
  V x = hn::Xor(low_words, hn::Set(d, k.key.low));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(d, 0x7FEB352Du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Xor(x, high_term);
  x = hn::Mul(x, hn::Set(d, 0x846CA68Bu));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

template <RoundingMode kMode>
QuantizeCounts QuantizeSpan(const Float32Kernel& kernel, const float* in, float* out, std::size_t n,
                            std::uint64_t first_index) {
  const Float32Kernel k = kernel;  // a local copy: the stores to `out` cannot alias it
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  QuantizeCounts total;
  total.elements = n;
  const hn::Mask<D> all = hn::FirstN(d, lanes);
  // a is ordinary when smallest_normal <= a <= largest_finite (unsigned wrap-around test).
  const V ordinary_low = hn::Set(d, k.smallest_normal);
  const V ordinary_span = hn::Set(d, k.largest_finite - k.smallest_normal + 1);
  std::size_t i = 0;
  while (i < n) {
    // Blocks keep the 32-bit lane counters from wrapping and the random
    // index's high word fixed.
    const std::uint64_t index = first_index + i;
    const std::uint64_t to_wrap = (std::uint64_t{1} << 32) - (index & 0xFFFFFFFFu);
    const std::size_t block = static_cast<std::size_t>(std::min<std::uint64_t>({std::uint64_t{n - i}, to_wrap, std::uint64_t{1} << 28}));
    const V high_term = hn::Set(d, k.key.high + static_cast<std::uint32_t>(index >> 32) * 0x9E3779B9u);
    Counters c{hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
    V low_words = hn::Iota(d, static_cast<std::uint32_t>(index));  // random indices of the lanes
    const V step = hn::Set(d, static_cast<std::uint32_t>(lanes));
    std::size_t j = 0;
    for (; j + lanes <= block; j += lanes, low_words = hn::Add(low_words, step)) {
      const V x = hn::BitCast(d, hn::LoadU(hn::RebindToFloat<D>(), in + i + j));
      const V draw = kMode == RoundingMode::stochastic ? Draws(d, k, low_words, high_term) : hn::Zero(d);
      const V a = hn::And(x, hn::Set(d, 0x7FFFFFFFu));
      const auto ordinary = hn::Or(hn::Lt(hn::Sub(a, ordinary_low), ordinary_span), hn::Eq(a, hn::Zero(d)));
      const V r = hn::AllTrue(d, ordinary) ? QuantizeOrdinaryLanes<kMode>(d, k, x, draw, c.inexact)
                                           : QuantizeLanes<kMode>(d, k, x, draw, all, c);
      hn::StoreU(hn::BitCast(hn::RebindToFloat<D>(), r), hn::RebindToFloat<D>(), out + i + j);
    }
    if (j < block) {  // the tail, through a full-width buffer
      HWY_ALIGN float buffer[HWY_MAX_BYTES / sizeof(float)] = {};
      const std::size_t left = block - j;
      std::memcpy(buffer, in + i + j, left * sizeof(float));
      const V x = hn::BitCast(d, hn::Load(hn::RebindToFloat<D>(), buffer));
      const V draw = kMode == RoundingMode::stochastic ? Draws(d, k, low_words, high_term) : hn::Zero(d);
      hn::Store(hn::BitCast(hn::RebindToFloat<D>(), QuantizeLanes<kMode>(d, k, x, draw, hn::FirstN(d, left), c)),
                hn::RebindToFloat<D>(), buffer);
      std::memcpy(out + i + j, buffer, left * sizeof(float));
    }
    HWY_ALIGN std::uint32_t lane_counts[5][HWY_MAX_BYTES / sizeof(std::uint32_t)];
    hn::Store(c.inexact, d, lane_counts[0]);
    hn::Store(c.flushed, d, lane_counts[1]);
    hn::Store(c.subnormal, d, lane_counts[2]);
    hn::Store(c.overflow, d, lane_counts[3]);
    hn::Store(c.nan, d, lane_counts[4]);
    for (std::size_t l = 0; l < lanes; ++l) {
      total.inexact += lane_counts[0][l];
      total.flushed_to_zero += lane_counts[1][l];
      total.subnormal += lane_counts[2][l];
      total.overflow += lane_counts[3][l];
      total.nan += lane_counts[4][l];
    }
    i += block;
  }
  return total;
}

QuantizeCounts QuantizeFloat32(const Float32Kernel& k, const float* in, float* out, std::size_t n,
                               std::uint64_t first_index) {
  switch (k.mode) {
    case RoundingMode::nearest_even: return QuantizeSpan<RoundingMode::nearest_even>(k, in, out, n, first_index);
    case RoundingMode::nearest_away: return QuantizeSpan<RoundingMode::nearest_away>(k, in, out, n, first_index);
    case RoundingMode::toward_zero: return QuantizeSpan<RoundingMode::toward_zero>(k, in, out, n, first_index);
    case RoundingMode::toward_positive:
      return QuantizeSpan<RoundingMode::toward_positive>(k, in, out, n, first_index);
    case RoundingMode::toward_negative:
      return QuantizeSpan<RoundingMode::toward_negative>(k, in, out, n, first_index);
    case RoundingMode::odd: return QuantizeSpan<RoundingMode::odd>(k, in, out, n, first_index);
    case RoundingMode::stochastic: return QuantizeSpan<RoundingMode::stochastic>(k, in, out, n, first_index);
  }
  return {};
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mpsim::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::detail {

HWY_EXPORT(QuantizeFloat32);
HWY_EXPORT(TargetName);

QuantizeCounts quantize_float32_vector(const Float32Kernel& kernel, const float* in, float* out, std::size_t n,
                                       std::uint64_t first_index) {
  return HWY_DYNAMIC_DISPATCH(QuantizeFloat32)(kernel, in, out, n, first_index);
}

const char* float32_vector_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace mpsim::detail
#endif
