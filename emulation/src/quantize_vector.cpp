// Vector kernel: storage -> format -> storage (binary32 or binary64 storage),
// on the bit pattern, with Highway's run-time dispatch (one binary, the best
// target of each CPU).
//
// Why integer rounding on the pattern works (binary32 shown; binary64 is the
// same with 52 mantissa bits and bias 1023). A positive pattern
// a = (e << 23) | f has the value (2^23 + f) * 2^(e-150) for e >= 1 and
// f * 2^-149 for e = 0. Let eff = max(e, 1) and M = a - ((eff-1) << 23): M is
// the significand with its hidden bit (< 2^24), and value = M * 2^(eff-150).
// The format's quantum at this value is 2^(eff-150+s) with
//   s = (23 - mantissa bits) + max(0, emin' - eff)     (gradual underflow)
// where emin' is the format's emin as a biased binary32 exponent. Rounding M to
// a multiple of 2^s and adding back (eff-1) << 23 gives the rounded pattern;
// a carry out of the significand lands in the exponent field, which is exactly
// the next binade. When s >= 24 the value is below one quantum: the result is 0
// or the smallest subnormal. Overflow is a pattern compare against the largest
// finite value. Rounding never goes through an intermediate format: one step,
// as the scalar reference does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "emulation/src/quantize_vector.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#if HWY_ARCH_X86_64
#include <immintrin.h>  // _mm_getcsr, _mm_setcsr (ScopedMxcsr), _MM_FROUND_*
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "emulation/src/quantize_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace mpsim::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The storage layout, as constants of the pattern type U.
template <class U>
struct Layout {
  static constexpr int kMantissa = sizeof(U) == 4 ? 23 : 52;
  static constexpr int kBits = 8 * sizeof(U);
  static constexpr U kSign = U{1} << (kBits - 1);
  static constexpr U kMagnitude = kSign - 1;
  static constexpr U kInfinity = kMagnitude ^ ((U{1} << kMantissa) - 1);
  static constexpr U kHidden = U{1} << kMantissa;
};

// Lanes where v & bits is not zero. Not Highway's TestBit: with several bits
// it means "any bit set" on AVX-512 but "all bits set" on AVX2, SSE4 and the
// scalar target (Highway 1.0.3), which made every block's nonzero count 0 on
// AVX2 CPUs until 2026-11-27.
template <class D>
HWY_INLINE hn::Mask<D> AnyBitSet(D d, hn::Vec<D> v, hn::Vec<D> bits) {
  return hn::Ne(hn::And(v, bits), hn::Zero(d));
}

// Counts lanes where `mask` holds (mask lanes are all ones: subtracting adds 1).
template <class D>
HWY_INLINE void Count(D d, hn::Vec<D>& counter, hn::Mask<D> mask) {
  counter = hn::Sub(counter, hn::VecFromMask(d, mask));
}
// Count's result as a value, the subtraction on AVX2 written so that its
// result lands in the counter's own register: GCC 12 put the new count in the
// mask's register and copied it back on the loop's edge, one instruction per
// count per vector in ShortLaneCounts' loops, which the front end bounds
// (FPU-path odd and stochastic rounding 2-5% faster in cache, 2026-11-29).
template <class D>
HWY_INLINE hn::Vec<D> CountedInPlace(D d, hn::Vec<D> counter, hn::Mask<D> mask) {
#if HWY_TARGET == HWY_AVX2 && (defined(__GNUC__) || defined(__clang__))
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
    auto raw = counter.raw;
    asm("vpsubd %1, %0, %0" : "+x"(raw) : "x"(hn::VecFromMask(d, mask).raw));
    return hn::Vec<D>{raw};
  }
#endif
  return hn::Sub(counter, hn::VecFromMask(d, mask));
}

// A count of mask lanes, kept the way the target counts cheapest. AVX-512
// keeps masks in k registers: their population count is scalar work beside
// the busy vector units. Other targets hold masks as vectors: subtracting the
// all-ones lanes is one vector operation where movemask, popcnt and add were
// three, one of them a read-modify-write of a counter the compiler kept in
// memory (AVX2, 2026-11-28: MXFP8 nearest-even 1.3x faster). Per-lane counts
// hold below 2^32 lanes' worth: callers flush them within 2^28 elements.
template <class D>
struct Tally {
  hn::Vec<D> lanes;
  std::uint64_t scalar = 0;

  HWY_INLINE void add(const Tally& other) {
    lanes = hn::Add(lanes, other.lanes);
    scalar += other.scalar;
  }
  HWY_INLINE void add(D d, hn::Mask<D> mask) {
#if HWY_TARGET <= HWY_AVX3
    scalar += hn::CountTrue(d, mask);
#else
    Count(d, lanes, mask);
#endif
  }
  std::uint64_t total(D d) const {
    HWY_ALIGN hn::TFromD<D> counts[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
    hn::Store(lanes, d, counts);
    std::uint64_t sum = scalar;
    for (std::size_t l = 0; l < hn::Lanes(d); ++l) sum += counts[l];
    return sum;
  }
};

// The general lane code counts in vectors (Count), the short paths in
// Tallies (a population count on AVX-512, vector lanes elsewhere). Below
// AVX-512 a Tally is a vector count too, so there the general code counts
// into the tallies: one register per kind, not two (16 registers; the AVX2
// short paths' constants had been reloaded every vector for want of them,
// 2026-11-29). Start every member at zero: Counters<D>::zero(d).
template <class D>
struct Counters {
#if HWY_TARGET <= HWY_AVX3
  hn::Vec<D> inexact, flushed, subnormal, overflow, nan;
  Tally<D> inexact_tally, flushed_tally, subnormal_tally, overflow_tally;

  static Counters zero(D d) {
    const hn::Vec<D> z = hn::Zero(d);
    return {z, z, z, z, z, {z}, {z}, {z}, {z}};
  }
#else
  hn::Vec<D> overflow, nan;
  Tally<D> inexact_tally, flushed_tally, subnormal_tally, overflow_tally;

  static Counters zero(D d) {
    const hn::Vec<D> z = hn::Zero(d);
    return {z, z, {z}, {z}, {z}, {z}};
  }
#endif
};

// The general lane code's counts of inexact, flushed and subnormal lanes:
// their vectors on AVX-512, else the kinds' tallies (Counters).
enum class LaneCount { inexact, flushed, subnormal };
template <LaneCount kKind, class D>
HWY_INLINE hn::Vec<D>& Lanes(Counters<D>& c) {
#if HWY_TARGET <= HWY_AVX3
  auto [inexact, flushed, subnormal] = std::tie(c.inexact, c.flushed, c.subnormal);
#else
  auto [inexact, flushed, subnormal] = std::tie(c.inexact_tally.lanes, c.flushed_tally.lanes, c.subnormal_tally.lanes);
#endif
  if constexpr (kKind == LaneCount::inexact) return inexact;
  else if constexpr (kKind == LaneCount::flushed) return flushed;
  else return subnormal;
}

// Stochastic rounding's decision: keep the draw's and the fraction's top
// random bits (a 0.32 fraction in the low 32 bits of each lane) and round away
// from zero when their sum carries out of 32 bits.
template <class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Mask<D> Carry(D d, const Kernel<U>& k, hn::Vec<D> fraction, hn::Vec<D> draw) {
  if (k.random_mask != ~std::uint32_t{0}) {
    const auto random_mask = hn::Set(d, static_cast<U>(k.random_mask));
    fraction = hn::And(fraction, random_mask);
    draw = hn::And(draw, random_mask);
  }
  const auto sum = hn::Add(fraction, draw);
  if constexpr (sizeof(U) == 4) return hn::Lt(sum, fraction);  // wrapped around
  else return hn::Ne(hn::ShiftRight<32>(sum), hn::Zero(d));
}

// The general case, lane by lane: subnormals, flushes, overflow, specials.
template <RoundingMode kMode, class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> QuantizeLanes(D d, const Kernel<U>& k, hn::Vec<D> x, hn::Vec<D> draw, hn::Mask<D> valid,
                                    Counters<D>& c) {
  using V = hn::Vec<D>;
  using L = Layout<U>;
  const V sign = hn::And(x, hn::Set(d, L::kSign));
  const V a = hn::And(x, hn::Set(d, L::kMagnitude));
  const V inf = hn::Set(d, L::kInfinity);
  const auto is_nan = hn::Gt(a, inf);
  const auto is_inf = hn::Eq(a, inf);

  const V one = hn::Set(d, U{1});
  const V eff = hn::Max(hn::ShiftRight<L::kMantissa>(a), one);
  const V significand = hn::Sub(a, hn::ShiftLeft<L::kMantissa>(hn::Sub(eff, one)));
  V s = hn::Set(d, k.format.shift);
  if (!k.format.flush_to_zero) {
    const V emin = hn::Set(d, k.format.min_normal_exponent);
    s = hn::Add(s, hn::Sub(hn::Max(emin, eff), eff));  // + max(0, emin - eff)
  } else if (k.format.shift > 0) {
    // Flush to zero decides tininess by rounding with an unbounded exponent
    // (IEEE 754 §7.5). Below the storage's smallest normal the pattern's
    // exponent field no longer shows the binade: the binade just below it needs
    // a quantum one binade finer, and only from there can rounding reach it.
    s = hn::Sub(s, hn::IfThenElseZero(hn::Lt(a, hn::Set(d, L::kHidden)), one));
  }
  // s > kMantissa already means "below one quantum"; keep shift counts in range.
  const V s_clamped = hn::Min(s, hn::Set(d, U{L::kBits - 1}));
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
      up = hn::Or(above_half, hn::And(at_half, AnyBitSet(d, q, one)));
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
    const V thirty_two = hn::Set(d, U{32});
    const auto left = hn::Lt(s, hn::Set(d, U{33}));
    const V max_shift = hn::Set(d, U{L::kBits - 1});
    const V left_count = hn::Min(hn::Sub(thirty_two, hn::Min(s, thirty_two)), max_shift);
    const V right_count = hn::Min(hn::Sub(hn::Max(s, thirty_two), thirty_two), max_shift);
    V fraction = hn::IfThenElse(left, rest << left_count, rest >> right_count);
    up = Carry(d, k, fraction, draw);
  }
  q = hn::Add(q, hn::IfThenElseZero(up, one));

  // Back to a pattern. Below one quantum (s > kMantissa) the result is 0 or the
  // smallest subnormal; otherwise the carry flows into the exponent field.
  const auto below_quantum = hn::Gt(s, hn::Set(d, U{L::kMantissa}));
  const V regular = hn::Add(hn::ShiftLeft<L::kMantissa>(hn::Sub(eff, one)), q << s_clamped);
  const V tiny_result = hn::IfThenElseZero(hn::Ne(q, hn::Zero(d)), hn::Set(d, k.format.smallest_subnormal));
  V magnitude = hn::IfThenElse(below_quantum, tiny_result, regular);
  if (k.format.flush_to_zero) magnitude = hn::IfThenZeroElse(hn::Lt(magnitude, hn::Set(d, k.format.smallest_normal)), magnitude);

  const auto finite = hn::Lt(a, inf);
  const auto overflow_finite = hn::And(finite, hn::Gt(magnitude, hn::Set(d, k.format.largest_finite)));
  const auto overflow = k.format.has_infinity ? overflow_finite : hn::Or(overflow_finite, is_inf);
  const V overflowed = hn::IfThenElse(negative, hn::Set(d, k.overflow_negative), hn::Set(d, k.overflow_positive));
  V result = hn::Or(magnitude, sign);
  result = hn::IfThenElse(overflow, overflowed, result);
  if (k.format.has_infinity) result = hn::IfThenElse(is_inf, x, result);
  if (k.format.has_nan) {
    result = hn::IfThenElse(is_nan, hn::Or(hn::And(x, hn::Set(d, k.format.nan_keep)), hn::Set(d, StorageLayout<U>::quiet_nan)), result);
  } else {  // Specials::none: a NaN becomes +largest finite, and counts as a NaN input
    result = hn::IfThenElse(is_nan, hn::Set(d, k.format.largest_finite), result);
    Count(d, c.nan, hn::And(valid, is_nan));
  }

  const V result_magnitude = hn::And(result, hn::Set(d, L::kMagnitude));
  const auto changed = hn::And(finite, hn::Ne(result_magnitude, a));
  Count(d, Lanes<LaneCount::inexact>(c), hn::And(valid, hn::Or(changed, overflow)));
  Count(d, c.overflow, hn::And(valid, overflow));
  Count(d, Lanes<LaneCount::flushed>(c), hn::And(valid, hn::And(hn::And(finite, hn::Ne(a, hn::Zero(d))),
                                             hn::Eq(result_magnitude, hn::Zero(d)))));
  Count(d, Lanes<LaneCount::subnormal>(c), hn::And(valid, hn::And(hn::Ne(result_magnitude, hn::Zero(d)),
                                               hn::Lt(result_magnitude, hn::Set(d, k.format.smallest_normal)))));
  Count(d, c.nan, hn::And(valid, hn::Gt(result_magnitude, inf)));
  return result;
}

// QuantizeLanes out of line, for whole vectors that leave a short path: the
// counters go in and come back by value, so that the loop around the short
// paths keeps its own in registers (a call that takes them by reference makes
// them live in memory throughout: on AVX2, with 16 registers, GCC 12 then kept
// every counter there, a store and reload per vector; perf, 2026-11-28).
template <class D>
struct LanesResult {
  hn::Vec<D> rounded;
  Counters<D> counters;
};
template <RoundingMode kMode, class D, class U = hn::TFromD<D>>
HWY_NOINLINE LanesResult<D> QuantizeLanesApart(D d, const Kernel<U>& k, hn::Vec<D> x, hn::Vec<D> draw,
                                               Counters<D> c) {
  const hn::Vec<D> r = QuantizeLanes<kMode>(d, k, x, draw, hn::FirstN(d, hn::Lanes(d)), c);
  return {r, c};
}

// Nearest-even on the whole pattern at the fixed quantum 2^base_shift: add half
// an ulp minus one, plus the kept last bit, and truncate; ties go to even. With
// no mantissa bits the significand is 1, always odd (the bit at the quantum is
// the exponent's): the host folds that into the bias (Kernel::nearest_bias),
// so that the loop has no branch and no constant to derive.
template <class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> RoundPatternNearestEven(D d, const Kernel<U>& k, hn::Vec<D> x) {
  const auto low = hn::Set(d, k.below_quantum);
  const auto parity = hn::And(x >> hn::Set(d, k.format.shift), hn::Set(d, k.nearest_parity_mask));
  return hn::AndNot(low, hn::Add(x, hn::Add(parity, hn::Set(d, k.nearest_bias))));
}

// The common case, taken when every lane is zero or within [smallest normal,
// largest finite]: no result can be subnormal, flushed, overflowed or NaN, the
// quantum is the same 2^(storage mantissa - format mantissa) in every lane, and
// rounding the whole pattern (sign included: no carry can reach it) to a
// multiple of it is the answer. Only the inexact counter can move.
template <RoundingMode kMode, class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> RoundOrdinaryLanes(D d, const Kernel<U>& k, hn::Vec<D> x, hn::Vec<D> draw) {
  using V = hn::Vec<D>;
  using L = Layout<U>;
  const V unit = hn::Set(d, k.quantum);
  const V low = hn::Set(d, k.below_quantum);
  const V truncated = hn::AndNot(low, x);
  V r;
  if constexpr (kMode == RoundingMode::nearest_even) {
    r = RoundPatternNearestEven(d, k, x);
  } else if constexpr (kMode == RoundingMode::nearest_away) {
    // No branch on shift 0 (unit 1, low and half 0: x itself), so that the
    // compiler hoists the constants out of the loop.
    r = hn::AndNot(low, hn::Add(x, hn::ShiftRight<1>(unit)));
  } else if constexpr (kMode == RoundingMode::toward_zero) {
    r = truncated;
  } else if constexpr (kMode == RoundingMode::toward_positive || kMode == RoundingMode::toward_negative) {
    const auto negative = AnyBitSet(d, x, hn::Set(d, L::kSign));
    const V away = hn::AndNot(low, hn::Add(x, low));
    r = kMode == RoundingMode::toward_positive ? hn::IfThenElse(negative, truncated, away)
                                               : hn::IfThenElse(negative, away, truncated);
  } else if constexpr (kMode == RoundingMode::odd) {
    // The bit to set, chosen on the host: no branch in the loop.
    r = hn::Or(truncated, hn::IfThenElseZero(hn::Ne(truncated, x), hn::Set(d, k.odd_bit)));
  } else {  // stochastic
    // The remainder as a 0.32 fraction of the quantum; none where the format
    // keeps every storage bit (shift 0: shifting by 32 is undefined).
    const V rest = hn::And(x, low);
    const V fraction = k.format.shift == 0   ? hn::Zero(d)
                       : k.format.shift <= 32 ? rest << hn::Set(d, U{32} - k.format.shift)
                                              : rest >> hn::Set(d, k.format.shift - U{32});
    r = hn::Add(truncated, hn::IfThenElseZero(Carry(d, k, fraction, draw), unit));
  }
  return r;
}

template <RoundingMode kMode, class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> QuantizeOrdinaryLanes(D d, const Kernel<U>& k, hn::Vec<D> x, hn::Vec<D> draw,
                                            Tally<D>& inexact) {
  const hn::Vec<D> r = RoundOrdinaryLanes<kMode>(d, k, x, draw);
  inexact.add(d, hn::Ne(r, x));
  return r;
}

// floor(fraction * 2^32) for a fraction in [0, 1) held in the storage's
// floating type: stochastic rounding's 0.32 fraction of the quantum. The
// product is exact (a power of two); truncating conversion floors it.
// The same from z = fraction * 2^32, in [0, 2^32): floor(z).
template <class D, class DF>
HWY_INLINE hn::Vec<D> FloorBits(D d, DF df, hn::Vec<DF> z) {
  const hn::RebindToSigned<DF> di;
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::BitCast(d, hn::ConvertTo(di, z));
  } else if constexpr (HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86 && hn::MaxLanes(D()) == 16) {
    // No inexact flag, no trap (maskz: the unmasked form trips a false GCC 12 warning).
    return hn::Vec<D>{_mm512_maskz_cvtt_roundps_epu32(0xFFFF, z.raw, _MM_FROUND_NO_EXC)};
  } else if constexpr (HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3) &&
                       hn::MaxLanes(D()) * 4 == HWY_MAX_BYTES) {
    // x86's truncating conversion without Highway's fix-up of out-of-range
    // lanes (three more instructions; 0x80000000 is what we want from them):
    // floor(z) = 2 floor(z / 2) + (floor(z) & 1). z / 2 < 2^31 converts
    // exactly; z itself where z < 2^31, and above that z is even (24-bit
    // significand) and the conversion's 0x80000000 has its last bit 0.
    const auto half = hn::Mul(z, hn::Set(df, 0.5f));
#if HWY_TARGET == HWY_AVX2
    const hn::Vec<D> whole{_mm256_cvttps_epi32(z.raw)}, halves{_mm256_cvttps_epi32(half.raw)};
#else
    const hn::Vec<D> whole{_mm_cvttps_epi32(z.raw)}, halves{_mm_cvttps_epi32(half.raw)};
#endif
    return hn::Or(hn::ShiftLeft<1>(halves), hn::And(whole, hn::Set(d, 1u)));
  } else {
    // int32 conversion covers [0, 2^31); at or above 2^31 z is an integer
    // (24-bit significand), and z - 2^31 is exact.
    const auto two31 = hn::Set(df, 2147483648.0f);
    const auto big = hn::Ge(z, two31);
    const auto low = hn::BitCast(d, hn::ConvertTo(di, hn::IfThenElse(big, hn::Sub(z, two31), z)));
    return hn::Xor(low, hn::IfThenElseZero(hn::RebindMask(d, big), hn::Set(d, Layout<hn::TFromD<D>>::kSign)));
  }
}

template <class D, class DF>
HWY_INLINE hn::Vec<D> FractionBits(D d, DF df, hn::Vec<DF> fraction) {
  return FloorBits(d, df, hn::Mul(fraction, hn::Set(df, 4294967296.0)));
}

// Any mode, gradual underflow, when every lane is zero or a normal number of
// the storage at most the largest finite value but some lie below the format's
// smallest normal (`small`: gradients that underflow). Lanes in the format's
// normal range round on the pattern as in QuantizeOrdinaryLanes. Below it the
// quantum is the fixed 2^(emin - M): y = x * 2^(M - emin) lies in (-2^M, 2^M),
// and rounding y to an integer and scaling back by 2^(emin - M) is the
// answer. `small` has no zero lanes (they take the ordinary code). Truncation, floor and ceiling are exact operations that ignore the
// FPU's rounding mode and keep the sign of zero; the other modes decide from
// |y|'s truncation t and remainder |y| - t (exact, Sterbenz), add one where
// they round away (t + 1 <= 2^M is exact) and put the sign back. The host
// enables this only where 2^(emin - M) is a normal number of the storage, and
// the caller only for lanes that are zero or normal in it: every operand and
// result is then normal or zero, the scalings are exact, and DAZ/FTZ cannot
// change a bit. Nearest-even uses (|x| + C) - C with C = 2^(emin - M + storage
// mantissa) where the host allows it (the FPU in round-to-nearest, half the
// smallest subnormal a normal number): the sum lies in [C, 2C), whose spacing
// is the subnormal quantum, so the one addition is the rounding and
// subtracting C is exact.
template <RoundingMode kMode, class D, class U = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> QuantizeSubnormalLanes(D d, const Kernel<U>& k, hn::Vec<D> x, hn::Vec<D> a, hn::Mask<D> small,
                                             hn::Mask<D> zero, hn::Vec<D> draw, Counters<D>& c) {
  using V = hn::Vec<D>;
  using L = Layout<U>;
  const hn::RebindToFloat<D> df;
  const hn::RebindToSigned<D> di;
  using T = hn::TFromD<decltype(df)>;
  using VF = hn::Vec<decltype(df)>;
  const V normal = RoundOrdinaryLanes<kMode>(d, k, x, draw);
  const VF scale = hn::BitCast(df, hn::Set(d, k.subnormal_scale));
  const VF quantum = hn::BitCast(df, hn::Set(d, k.subnormal_quantum));
  // Lanes in the normal range are discarded: zeroing them keeps every y finite.
  constexpr bool kSigned = (kMode == RoundingMode::toward_zero || kMode == RoundingMode::toward_positive ||
                            kMode == RoundingMode::toward_negative || kMode == RoundingMode::nearest_away) &&
                           HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4;  // rounding instructions that keep -0
  V small_result;
  if constexpr (kSigned) {
    const VF y = hn::Mul(hn::BitCast(df, hn::IfThenElseZero(small, x)), scale);
    VF rounded;
    if constexpr (kMode == RoundingMode::toward_zero) {
      rounded = hn::Trunc(y);
    } else if constexpr (kMode == RoundingMode::toward_positive) {
      rounded = hn::Ceil(y);
    } else if constexpr (kMode == RoundingMode::toward_negative) {
      rounded = hn::Floor(y);
    } else {
      // Nearest-away: with t = trunc(y) and y = t + f, 2y - t = t + 2f is exact
      // (no wider than 2y) and nonzero (y is: `small` has no zero lanes), and
      // its truncation is t plus one away from zero exactly when |f| >= 1/2.
      rounded = hn::Trunc(hn::Sub(hn::Add(y, y), hn::Trunc(y)));
    }
    small_result = hn::BitCast(d, hn::Mul(rounded, quantum));
  } else {
    const V small_magnitude = hn::IfThenElseZero(small, a);
    VF rounded;
    if (kMode == RoundingMode::nearest_even && k.subnormal_magic != 0) {
      const VF magic = hn::BitCast(df, hn::Set(d, k.subnormal_magic));
      small_result = hn::BitCast(d, hn::Sub(hn::Add(hn::BitCast(df, small_magnitude), magic), magic));
    } else {
      const VF y = hn::Mul(hn::BitCast(df, small_magnitude), scale);
      if constexpr (kMode == RoundingMode::toward_zero) {
        rounded = hn::Trunc(y);
      } else if constexpr (kMode == RoundingMode::toward_positive || kMode == RoundingMode::toward_negative) {
        const auto negative = hn::RebindMask(df, hn::Lt(hn::BitCast(di, x), hn::Zero(di)));
        rounded = (kMode == RoundingMode::toward_positive) == true ? hn::IfThenElse(negative, hn::Trunc(y), hn::Ceil(y))
                                                                   : hn::IfThenElse(negative, hn::Ceil(y), hn::Trunc(y));
      } else if constexpr (kMode == RoundingMode::odd) {
        // The truncation t < 2^M plus 2^(storage mantissa) is exact, and its
        // pattern's last bit is t's: set it when inexact, and subtract again
        // (exact, and nonzero: y is).
        const VF t = hn::Trunc(y);
        const VF magic = hn::Set(df, static_cast<T>(L::kHidden));
        const V biased = hn::BitCast(d, hn::Add(t, magic));
        const V odd = hn::Or(biased, hn::IfThenElseZero(hn::RebindMask(d, hn::Ne(t, y)), hn::Set(d, U{1})));
        rounded = hn::Sub(hn::BitCast(df, odd), magic);
      } else {
        const VF t = hn::Trunc(y);
        const VF rest = hn::Sub(y, t);  // exact (Sterbenz)
        const VF f_half = hn::Set(df, T{0.5});
        hn::Mask<decltype(df)> up;
        if constexpr (kMode == RoundingMode::nearest_even) {
          const VF half_t = hn::Mul(t, f_half);
          const auto t_odd = hn::Ne(hn::Trunc(half_t), half_t);
          up = hn::Or(hn::Gt(rest, f_half), hn::And(hn::Eq(rest, f_half), t_odd));
        } else if constexpr (kMode == RoundingMode::nearest_away) {
          up = hn::Ge(rest, f_half);
        } else {  // stochastic
          up = hn::RebindMask(df, Carry(d, k, FractionBits(d, df, rest), draw));
        }
        rounded = hn::Add(t, hn::IfThenElseZero(up, hn::Set(df, T{1})));
      }
      small_result = hn::BitCast(d, hn::Mul(rounded, quantum));
    }
    small_result = hn::Or(small_result, hn::And(x, hn::Set(d, L::kSign)));
  }
  const V r = hn::IfThenElse(small, small_result, normal);
  // Counters: no lane is NaN, infinite or overflows, and every sign is kept.
  // (The magnitude itself is used below; see AnyBitSet for why not TestBit.)
  const V magnitude = hn::And(r, hn::Set(d, L::kMagnitude));
  const auto nonzero_result = hn::Ne(magnitude, hn::Zero(d));
  c.inexact_tally.add(d, hn::Ne(r, x));
  c.flushed_tally.add(d, hn::Not(hn::Or(zero, nonzero_result)));
  c.subnormal_tally.add(d, hn::And(nonzero_result, hn::Lt(magnitude, hn::Set(d, k.format.smallest_normal))));
  return r;
}

// Rounding directions of an addition, as x86's rounding-control field codes them.
enum AdditionRounding : unsigned { kToNearest = 0, kDownward = 1, kUpward = 2, kTowardZero = 3 };
#if HWY_ARCH_X86_64
static_assert(kToNearest == _MM_FROUND_TO_NEAREST_INT && kDownward == _MM_FROUND_TO_NEG_INF &&
              kUpward == _MM_FROUND_TO_POS_INF && kTowardZero == _MM_FROUND_TO_ZERO);
#endif

// AVX-512 names the rounding of each addition in the instruction. Other x86-64
// targets run QuantizeShortLanesFpu's loop with MXCSR's rounding set for the
// call (ScopedMxcsr, in QuantizeMode, on every x86-64 target), so their plain
// additions round as the mode needs (not 32-bit x86, whose scalar code may use
// the x87 unit).
// Elsewhere the path serves nearest-even only, where the host found the FPU
// rounding to nearest (Kernel::subnormal_magic != 0, which also needs mantissa
// bits and a normal subnormal quantum).
constexpr bool kNamedRounding = HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3;

// Whether QuantizeShortLanesFpu serves mode kMode on this target.
template <RoundingMode kMode, class D>
constexpr bool kFpuShortPath = sizeof(hn::TFromD<D>) == 4 && (HWY_ARCH_X86_64 || kMode == RoundingMode::nearest_even);

// The rounding of QuantizeShortLanesFpu's main addition in mode kMode.
template <RoundingMode kMode>
constexpr AdditionRounding kSumRounding = kMode == RoundingMode::nearest_even      ? kToNearest
                                          : kMode == RoundingMode::toward_positive ? kUpward
                                          : kMode == RoundingMode::toward_negative ? kDownward
                                                                                   : kTowardZero;

#if HWY_ARCH_X86_64
// For a scope: MXCSR's rounding control set to `rounding` (bits 13-14), every
// floating-point exception masked (bits 7-12: an unmasked inexact would trap
// on the first rounding), and DAZ and FTZ cleared (bits 6 and 15), so that a
// binary32 subnormal operand or result is the IEEE 754 value whatever the
// caller set: QuantizeShortLanesFpu then serves subnormal inputs too, and the
// short path's test is one comparison (VectorRounder). Restored after.
class ScopedMxcsr {
 public:
  explicit ScopedMxcsr(AdditionRounding rounding) : saved_(_mm_getcsr()) {
    _mm_setcsr((saved_ & ~0xE040u) | 0x1F80u | (static_cast<unsigned>(rounding) << 13));
  }
  ~ScopedMxcsr() { _mm_setcsr(saved_); }
  ScopedMxcsr(const ScopedMxcsr&) = delete;
  ScopedMxcsr& operator=(const ScopedMxcsr&) = delete;

 private:
  unsigned saved_;
};
#endif

// a + b in binary32, rounded as kRounding says: named in the instruction on
// AVX-512; elsewhere the FPU's own rounding, which the caller set to kRounding.
template <AdditionRounding kRounding, class DF>
HWY_INLINE hn::Vec<DF> AddRounded(DF df, hn::Vec<DF> a, hn::Vec<DF> b) {
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
  static_assert(hn::MaxLanes(DF()) == 16, "named rounding needs whole 512-bit vectors");
  (void)df;
  return hn::Vec<DF>{_mm512_maskz_add_round_ps(0xFFFF, a.raw, b.raw, kRounding | _MM_FROUND_NO_EXC)};  // maskz: see FloorBits
#else
  (void)df;
  return hn::Add(a, b);
#endif
}

// a - b, exact by construction in the callers. Named rounding to nearest on
// AVX-512 makes an exact zero +0 whatever MXCSR says; elsewhere the zero is -0
// when the FPU rounds downward, and the callers' results do not depend on it.
template <class DF>
HWY_INLINE hn::Vec<DF> SubExact(DF df, hn::Vec<DF> a, hn::Vec<DF> b) {
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX3
  static_assert(hn::MaxLanes(DF()) == 16, "named rounding needs whole 512-bit vectors");
  (void)df;
  return hn::Vec<DF>{_mm512_maskz_sub_round_ps(0xFFFF, a.raw, b.raw, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
#else
  (void)df;
  return hn::Sub(a, b);
#endif
}

#if HWY_TARGET == HWY_AVX2
// QuantizeShortLanesFpu's stochastic magnitude on AVX2, the remainder's 0.32
// fraction of the quantum taken from the pattern, not the FPU: AVX2 has no
// unsigned conversion or comparison, and its 16 registers could not hold the
// FPU route's constants (2026-11-29: about 105 instructions per 8 lanes, a
// fifth of them constants reloaded). With e = a >> 23 and the quantum's
// binade b = max(e, emin), m = (a & (2^23 - 1)) | 2^23 is the significand and
// s = b - e + 23 - mantissa bits of its bits lie below the quantum (s >= 1);
// the fraction is m << (32 - s) for s <= 32 (the bits at and above the
// quantum shift out), else m >> (s - 32); from h = m << 8 (whose low 8 bits
// are 0) the same is h << (24 - s) for s <= 24, else h >> (s - 24). AVX2's
// variable shifts give 0 for counts above 31 (Intel SDM, VPSLLVD/VPSRLVD),
// so both shifts of the one signed count s - 24, or-ed, give the fraction for
// every s. h = (a << 8) | 2^31 needs no constant but the sign bit's, live
// anyway (AVX2 has 16 registers). A binary32 subnormal (e = 0) lies below
// 2^-126 <= q 2^-32 (q >= 2^-94, the host's condition): its fraction is 0, and
// so are both shifts of h (the hidden bit set regardless), as s - 24 = b + 23
// - M - 24 >= 32 there. The carry (Carry) is that of fraction + draw.
template <class D>
HWY_INLINE hn::Vec<D> StochasticMagnitudeAvx2(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> a, hn::Vec<D> draw) {
  using V = hn::Vec<D>;
  const hn::RebindToFloat<D> df;
  const V e = hn::ShiftRight<23>(a);
  const V binade = hn::Max(e, hn::Set(d, k.format.min_normal_exponent));
  const auto magic = hn::BitCast(df, hn::Add(hn::ShiftLeft<23>(binade), hn::Set(d, k.fpu_magic_offset)));
  const V truncated = hn::BitCast(d, AddRounded<kTowardZero>(df, hn::BitCast(df, a), magic));
  // m << 8, its hidden bit the sign bit's constant.
  const V high_significand = hn::Or(hn::ShiftLeft<8>(a), hn::Set(d, 0x80000000u));
  // s - 24 and 24 - s, two's-complement counts (a negative one is above 31 unsigned).
  const V offset_binade = hn::Add(binade, hn::Set(d, k.fpu_shift_offset));
  const V s_minus_24 = hn::Sub(offset_binade, e), minus_s_minus_24 = hn::Sub(e, offset_binade);
  V fraction{_mm256_or_si256(_mm256_sllv_epi32(high_significand.raw, minus_s_minus_24.raw),
                             _mm256_srlv_epi32(high_significand.raw, s_minus_24.raw))};
  if (k.random_mask != ~std::uint32_t{0}) {
    const V random_mask = hn::Set(d, k.random_mask);
    fraction = hn::And(fraction, random_mask);
    draw = hn::And(draw, random_mask);
  }
  // draw > ~fraction, unsigned: (draw ^ 2^31) > (fraction ^ (2^31 - 1)), signed.
  const hn::RebindToSigned<D> di;
  const auto carry = hn::Gt(hn::BitCast(di, hn::Xor(draw, hn::Set(d, 0x80000000u))),
                            hn::BitCast(di, hn::Xor(fraction, hn::Set(d, 0x7FFFFFFFu))));
  // One quantum more where the sum carried (the mask's lanes are -1).
  const V rounded = hn::Sub(truncated, hn::VecFromMask(d, hn::RebindMask(d, carry)));
  return hn::BitCast(d, SubExact(df, hn::BitCast(df, rounded), magic));
}
#endif


// Any mode, binary32 storage, when every lane is at most the largest finite
// value (on x86-64, under ScopedMxcsr: no DAZ, no FTZ, so binary32 subnormals
// too; elsewhere zero or binary32-normal lanes only), in the FPU. |x| lies in binade e (or below the format's emin, where the
// quantum stops shrinking: take e = emin); its quantum is q = 2^(e - M), and
// C = 2^(e + 23 - M) lies above |x| (M <= 22): |x| + C falls in [C, 2C], where
// binary32's spacing is q, so one addition rounded in the wanted direction
// rounds |x| to a multiple of q, and subtracting C is exact. One formula for
// normal and subnormal results. Nearest-away adds q/2 first, rounding toward
// zero (exact on the grid of q: the bits it may drop lie below q); round-to-odd
// truncates and sets the sum's last bit (q's) when something was dropped (the
// sum rounded upward is then one more); stochastic truncates, takes the
// remainder |x| - t (exact) in units of q, and adds one q on the reference's
// carry (Carry). Toward +/-infinity round the signed value with C signed like
// x. The host enables it (fpu_magic_offset != 0) only where q >= 2^-94, so
// that q/2, 2^32/q and every remainder that can decide a draw are normal
// (DAZ and FTZ, where the caller's, cannot change a bit) and a binary32
// subnormal lies below q 2^-32 (StochasticMagnitudeAvx2 relies on it).
// Returns the rounded magnitude; `exact`: the lanes where it is a itself.
template <RoundingMode kMode, class D>
HWY_INLINE hn::Vec<D> ShortLanesFpuMagnitude(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> x, hn::Vec<D> a,
                                             hn::Vec<D> draw, hn::Mask<D>& exact) {
  using V = hn::Vec<D>;
#if HWY_TARGET == HWY_AVX2
  if constexpr (kMode == RoundingMode::stochastic) {  // its own constants, from the pattern
    const V magnitude = StochasticMagnitudeAvx2(d, k, a, draw);
    exact = hn::Eq(magnitude, a);
    return magnitude;
  }
#endif
  const hn::RebindToFloat<D> df;
  const V binade = hn::Max(hn::And(a, hn::Set(d, 0x7F800000u)), hn::Set(d, k.fpu_min_binade));
  const V magic_bits = hn::Add(binade, hn::Set(d, k.fpu_magic_offset));
  const auto magic = hn::BitCast(df, magic_bits);
  const auto fa = hn::BitCast(df, a);
  V magnitude;
  constexpr AdditionRounding kSum = kSumRounding<kMode>;
  if constexpr (kMode == RoundingMode::nearest_even || kMode == RoundingMode::toward_zero) {
    magnitude = hn::BitCast(d, SubExact(df, AddRounded<kSum>(df, fa, magic), magic));
  } else if constexpr (kMode == RoundingMode::toward_positive || kMode == RoundingMode::toward_negative) {
    const auto signed_magic = hn::BitCast(df, hn::Or(magic_bits, hn::Xor(x, a)));
    const auto r = SubExact(df, AddRounded<kSum>(df, hn::BitCast(df, x), signed_magic), signed_magic);
    magnitude = hn::And(hn::BitCast(d, r), hn::Set(d, 0x7FFFFFFFu));
  } else if constexpr (kMode == RoundingMode::nearest_away) {
    const auto half_quantum = hn::BitCast(df, hn::Sub(magic_bits, hn::Set(d, 24u << 23)));
    const auto sum = AddRounded<kTowardZero>(df, AddRounded<kTowardZero>(df, fa, half_quantum), magic);
    magnitude = hn::BitCast(d, SubExact(df, sum, magic));
  } else if constexpr (kMode == RoundingMode::odd) {
    const auto sum = AddRounded<kTowardZero>(df, fa, magic);
    V odd;
    if constexpr (kNamedRounding) {
      // Rounded up, the sum's pattern is one more than truncated exactly when
      // something was dropped: its last bit is the one to set.
      odd = hn::Or(hn::BitCast(d, sum), hn::And(hn::BitCast(d, AddRounded<kUpward>(df, fa, magic)), hn::Set(d, 1u)));
    } else {
      // Exact where the truncation dropped nothing (the result is then a itself; else it is odd on the
      // grid, and a is not): the one comparison serves the last bit and the counts.
      exact = hn::RebindMask(d, hn::Eq(hn::BitCast(d, SubExact(df, sum, magic)), a));
      odd = hn::Or(hn::BitCast(d, sum), hn::AndNot(hn::VecFromMask(d, exact), hn::Set(d, 1u)));
      return hn::BitCast(d, SubExact(df, hn::BitCast(df, odd), magic));
    }
    magnitude = hn::BitCast(d, SubExact(df, hn::BitCast(df, odd), magic));
  } else {  // stochastic (AVX2: above)
    const auto sum = AddRounded<kTowardZero>(df, fa, magic);
    const auto rest = hn::Sub(fa, SubExact(df, sum, magic));
    // 2^32 / q, from C = 2^23 q: a normal number (q >= 2^-94); the product is exact.
    const auto bits_per_quantum = hn::BitCast(df, hn::Sub(hn::Set(d, (254u + 23u + 32u) << 23), magic_bits));
    const V up = hn::IfThenElseZero(Carry(d, k, FloorBits(d, df, hn::Mul(rest, bits_per_quantum)), draw), hn::Set(d, 1u));
    magnitude = hn::BitCast(d, SubExact(df, hn::BitCast(df, hn::Add(hn::BitCast(d, sum), up)), magic));
  }
  exact = hn::Eq(magnitude, a);
  return magnitude;
}

// Whether a result magnitude lies below the format's smallest normal
// (magnitudes lie below 2^31: a signed comparison, one instruction on every target).
template <class D>
HWY_INLINE hn::Mask<D> BelowNormal(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> magnitude) {
  const hn::RebindToSigned<D> di;
  return hn::RebindMask(d, hn::Lt(hn::BitCast(di, magnitude), hn::Set(di, static_cast<std::int32_t>(k.format.smallest_normal))));
}

// Whether a result magnitude is subnormal, 0 < magnitude < smallest normal:
// magnitude - 1 + 2^31 (mod 2^32) maps 0 to the largest signed value and
// [1, 2^31) onto [-2^31, 0) in order, so one addition and one signed comparison.
template <class D>
HWY_INLINE hn::Mask<D> SubnormalResult(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> magnitude) {
  const hn::RebindToSigned<D> di;
  const auto shifted = hn::BitCast(di, hn::Add(magnitude, hn::Set(d, 0x7FFFFFFFu)));
  const auto bound = static_cast<std::int32_t>(k.format.smallest_normal - 1u + 0x80000000u);
  return hn::RebindMask(d, hn::Lt(shifted, hn::Set(di, bound)));
}

// QuantizeShortLanesFpu's rounding of x (magnitude a; `zero`: a == 0), counted in c.
template <RoundingMode kMode, class D>
HWY_INLINE hn::Vec<D> QuantizeShortLanesFpu(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> x, hn::Vec<D> a,
                                            hn::Mask<D> zero, hn::Vec<D> draw, Counters<D>& c) {
  hn::Mask<D> exact;
  const hn::Vec<D> magnitude = ShortLanesFpuMagnitude<kMode>(d, k, x, a, draw, exact);
  const hn::Vec<D> r = hn::Or(magnitude, hn::Xor(x, a));
  const auto zero_result = hn::Eq(magnitude, hn::Zero(d));
  c.inexact_tally.add(d, hn::Ne(r, x));
  c.flushed_tally.add(d, hn::AndNot(zero, zero_result));
  c.subnormal_tally.add(d, hn::AndNot(zero_result, BelowNormal(d, k, magnitude)));
  return r;
}

#if HWY_TARGET > HWY_AVX3
// The short paths' counts in QuantizeSpan's inner loop below AVX-512 on
// x86-64, where a count is a vector operation per mask (Tally): four masks
// that need no combining, each count one subtraction, and the kinds derived
// where the loop ends (MoveInto): inexact = lanes seen - exact (Ne would be an
// equality and a negation on AVX2), flushed = zero results - zero inputs (a
// zero input's result is +0 or -0), subnormal = results below normal - zero
// results (a zero is below normal). Eight vector operations per FPU-path
// vector where counting the kinds took ten (seven with the two 16-bit counts
// of add(), five for round-to-odd); two for ordinary lanes. (Three
// counts, flushed as "zero and not exact", measured slower on AVX2: odd on
// binary16 gradients 4.86 -> 4.47 G/s in cache, 2026-11-29.)
template <class D>
struct ShortLaneCounts {
  // What add() leaves in them depends on the mode (see add): round-to-odd
  // keeps subnormal results in below_normal and no zero counts; the other
  // modes with kPacked keep zero results and results below normal as the low
  // and high 16 bits of below_normal, which MoveInto splits into the two.
  hn::Vec<D> exact, zero_input, zero_result, below_normal;
  // Vectors counted, at most 2^17 / lanes (QuantizeSpan moves the counts out per
  // block), added by the caller from its loop's positions: an increment in add()
  // made GCC 12 copy the count vectors from register to register every vector
  // (AVX2 nearest-even on binary16 gradients 5.7 -> 5.2 G/s in cache, 2026-11-29).
  std::uint32_t vectors;

  static ShortLaneCounts zero(D d) {
    const hn::Vec<D> z = hn::Zero(d);
    return {z, z, z, z, 0};
  }
  // A vector of ordinary lanes (RoundOrdinaryLanes): only inexact can count.
  HWY_INLINE void add_ordinary(D d, hn::Vec<D> x, hn::Vec<D> r) { exact = CountedInPlace(d, exact, hn::Eq(r, x)); }
  // QuantizeSpan's blocks span at most 2^17 elements, so below AVX-512 a lane
  // counts fewer than 2^16 of them: its zero results and its results below
  // normal share one lane of below_normal as two 16-bit counts (zero results
  // in the low half).
  static constexpr bool kPacked = sizeof(hn::TFromD<D>) == 4 && HWY_TARGET != HWY_SCALAR;

  // An FPU-path vector: `is_exact`, where its magnitude is a's (ShortLanesFpuMagnitude).
  // - Round-to-odd never flushes there (the FPU path underflows gradually, and
  //   an inexact result is odd, so not zero): its zero results are its zero
  //   inputs, and it counts only the exact and the subnormal results (into
  //   below_normal, the zero counts left at 0): one comparison and two counts
  //   fewer per vector.
  // - The other modes count zero and below-normal results with one 16-bit
  //   comparison and one count (kPacked): both halves of a lane hold its
  //   result's high half, which is 0 only for a zero result (a nonzero one is
  //   at least q >= 2^-94) and below the smallest normal's high half only for a
  //   result below it (that normal, a power of two, has a low half of 0). One
  //   operation fewer per vector.
  // (FPU-path odd, directed and stochastic rounding on binary16 gradients, AVX2: docs/performance.md, 2026-11-29.)
  template <RoundingMode kMode>
  HWY_INLINE void add(D d, const Kernel<std::uint32_t>& k, hn::Mask<D> is_exact, hn::Vec<D> a, hn::Vec<D> magnitude) {
    exact = CountedInPlace(d, exact, is_exact);
    if constexpr (kMode == RoundingMode::odd) {
      below_normal = CountedInPlace(d, below_normal, SubnormalResult(d, k, magnitude));
      return;
    }
    zero_input = CountedInPlace(d, zero_input, hn::Eq(a, hn::Zero(d)));
    if constexpr (kPacked) {
      const hn::Repartition<std::int16_t, D> d16;
      const hn::Repartition<std::uint8_t, D> d8;
      alignas(16) static constexpr std::uint8_t kHighHalves[16] = {2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15};
      const auto high_halves = hn::TableLookupBytes(magnitude, hn::BitCast(d, hn::LoadDup128(d8, kHighHalves)));
      // Low halves: 1 > the high half (zero); high halves: the smallest normal's high half > it.
      const auto bounds = hn::BitCast(d16, hn::Set(d, (k.format.smallest_normal & 0xFFFF0000u) | 1u));
      const auto below = hn::Gt(bounds, hn::BitCast(d16, high_halves));
      below_normal = hn::BitCast(d, hn::Sub(hn::BitCast(d16, below_normal), hn::VecFromMask(d16, below)));
    } else {
      zero_result = CountedInPlace(d, zero_result, hn::Eq(magnitude, hn::Zero(d)));
      below_normal = CountedInPlace(d, below_normal, BelowNormal(d, k, magnitude));
    }
  }
  // Adds the counts to c's tallies and starts again from zero.
  template <RoundingMode kMode>
  HWY_INLINE void MoveInto(D d, Counters<D>& c) {
    if constexpr (kMode != RoundingMode::odd && kPacked) {
      HWY_DASSERT(vectors < (1u << 16));
      zero_result = hn::And(below_normal, hn::Set(d, 0xFFFFu));
      below_normal = hn::ShiftRight<16>(below_normal);
    }
    c.inexact_tally.lanes = hn::Add(c.inexact_tally.lanes, hn::Sub(hn::Set(d, vectors), exact));
    c.flushed_tally.lanes = hn::Add(c.flushed_tally.lanes, hn::Sub(zero_result, zero_input));
    c.subnormal_tally.lanes = hn::Add(c.subnormal_tally.lanes, hn::Sub(below_normal, zero_result));
    *this = zero(d);
  }
};
#endif

// random_draw (random_draw.hpp) from its first product on: `product`, the
// state after the first multiplication.
template <class D32>
HWY_INLINE hn::Vec<D32> DrawsFromProduct(D32 d, hn::Vec<D32> product, hn::Vec<D32> high_term) {
  auto x = hn::Xor(product, hn::ShiftRight<15>(product));
  x = hn::Xor(x, high_term);
  x = hn::Mul(x, hn::Set(d, kDrawMultiplier2));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}
// The same from the state after its first xorshift (`mixed`) on.
template <class D32>
HWY_INLINE hn::Vec<D32> DrawsFromMixed(D32 d, hn::Vec<D32> mixed, hn::Vec<D32> high_term) {
  return DrawsFromProduct(d, hn::Mul(mixed, hn::Set(d, kDrawMultiplier1)), high_term);
}
// The keyed hash of random_draw, on 32-bit lanes of consecutive indices whose
// high word is the same (the caller splits at multiples of 2^32).
template <class D32>
HWY_INLINE hn::Vec<D32> Draws(D32 d, DrawKey key, hn::Vec<D32> low_words, hn::Vec<D32> high_term) {
  const auto x = hn::Xor(low_words, hn::Set(d, key.low));
  return DrawsFromMixed(d, hn::Xor(x, hn::ShiftRight<16>(x)), high_term);
}

// 32-bit draws as the lanes of D, zero-extended where those are 64-bit.
template <class D, class V32>
HWY_INLINE hn::Vec<D> DrawLanes(D d, V32 draws) {
  if constexpr (sizeof(hn::TFromD<D>) == 4) return draws;
  else return hn::PromoteTo(d, draws);
}
// The draws of the lanes of D, one per lane.
template <class D, class D32>
HWY_INLINE hn::Vec<D> LaneDraws(D d, D32 d32, DrawKey key, hn::Vec<D32> low_words, hn::Vec<D32> high_term) {
  return DrawLanes(d, Draws(d32, key, low_words, high_term));
}
// The same for low words that share their bits 16 to 31 (one 2^16 window of
// indices, whose draw_window_term is window_term): two operations fewer. For
// the hot loop's vectors whose first index is not a multiple of the lane count
// (AlignedWindowDraws below needs one).
template <class D, class D32>
HWY_INLINE hn::Vec<D> SteppedWindowDraws(D d, D32 d32, hn::Vec<D32> low_words, hn::Vec<D32> window_term,
                                         hn::Vec<D32> high_term) {
  return DrawLanes(d, DrawsFromMixed(d32, hn::Xor(low_words, window_term), high_term));
}

// The draws of whole vectors of D inside one 2^16 window of indices, each
// vector's first index a multiple of its lane count L (a power of two). With
// T the window's draw_window_term, random_draw's state after its first
// xorshift is (P + l) ^ T for lane l of the vector at index P; as P's low
// log2(L) bits are 0 and l < L, that is (P ^ (T & -L)) + (l ^ (T & (L - 1))),
// two terms with no bit in common, so the first multiplication distributes
// over the sum: the first term's product is one scalar per vector (integer
// unit; AlignedFirstProduct), the second's a constant vector
// (AlignedLaneProducts). Three vector operations fewer per vector than
// hashing stepped indices (the xor, the multiplication and the step), one
// more: the addition (docs/performance.md, 2026-11-29).
inline std::uint32_t AlignedFirstProduct(std::uint32_t first_word, std::uint32_t window_term, std::size_t lanes) {
  return (first_word ^ (window_term & ~static_cast<std::uint32_t>(lanes - 1))) * kDrawMultiplier1;
}
template <class D32>
HWY_INLINE hn::Vec<D32> AlignedLaneProducts(D32 d32, std::uint32_t window_term, std::size_t lanes) {
  HWY_DASSERT(hn::Lanes(d32) == lanes);
  const auto low_term = hn::Set(d32, window_term & static_cast<std::uint32_t>(lanes - 1));
  return hn::Mul(hn::Xor(hn::Iota(d32, 0), low_term), hn::Set(d32, kDrawMultiplier1));
}
// `value` in every lane, broadcast from memory (`slot`) on x86-64: a 256-bit
// or narrower broadcast load takes no vector operation (from a general
// register it takes two, vmovd and vpbroadcastd), a 512-bit one at most a
// shuffle (maskz: the unmasked intrinsic trips GCC 12's -Wmaybe-uninitialized
// in its own header). The broadcast intrinsics take a pointer, which keeps
// GCC from forwarding the stored value through a register. Stochastic
// rounding on gradient-like data in cache, medians of 9 and 7 interleaved
// runs (2026-11-29): binary16 on AVX2 2.94 G/s with the stepped hash, 2.90
// with AlignedWindowDraws and a register broadcast, 3.05 with this one;
// bfloat16 on AVX-512 9.19, 9.13 and 9.67.
template <class D32>
HWY_INLINE hn::Vec<D32> BroadcastThroughMemory(D32 d32, std::uint32_t value, float& slot) {
#if HWY_ARCH_X86_64 && HWY_TARGET <= HWY_AVX2
  slot = std::bit_cast<float>(value);
  if constexpr (hn::MaxLanes(D32()) == 4) return hn::Vec<D32>{_mm_castps_si128(_mm_broadcast_ss(&slot))};
  if constexpr (hn::MaxLanes(D32()) == 8) return hn::Vec<D32>{_mm256_castps_si256(_mm256_broadcast_ss(&slot))};
#if HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(D32()) == 16) {
    return hn::Vec<D32>{_mm512_castps_si512(_mm512_maskz_broadcastss_ps(0xFFFF, _mm_broadcast_ss(&slot)))};
  }
#endif
#endif
  (void)slot;
  return hn::Set(d32, value);
}
template <class D, class D32>
HWY_INLINE hn::Vec<D> AlignedWindowDraws(D d, D32 d32, std::uint32_t first_product, hn::Vec<D32> lane_products,
                                         hn::Vec<D32> high_term, float& slot) {
  const auto product = hn::Add(BroadcastThroughMemory(d32, first_product, slot), lane_products);
  return DrawLanes(d, DrawsFromProduct(d32, product, high_term));
}

// How a vector on the short path (no lane above the largest finite value;
// binary32 subnormals only under ScopedMxcsr, on x86-64) rounds: `pattern`, on the pattern when
// no lane lies below the format's smallest normal (QuantizeOrdinaryLanes), else
// QuantizeSubnormalLanes; `pattern_then_fpu`, the same with
// QuantizeShortLanesFpu for the second; `fpu`, QuantizeShortLanesFpu always
// (one test and branch fewer, best where most vectors hold such lanes).
enum class ShortLanes { pattern, pattern_then_fpu, fpu };

// One whole vector of the storage, any mode: the short paths where every
// lane allows them (as kShort says), else the general lane code. Constants
// worked out once per call; kShort is chosen per call too (QuantizeMode).
template <RoundingMode kMode, class D, ShortLanes kShort = ShortLanes::pattern, class U = hn::TFromD<D>>
struct VectorRounder {
  using V = hn::Vec<D>;
  // Scalars, not vectors: sizeless vector types cannot be members; the Sets hoist out of loops.
  HWY_INLINE V operator()(D d, V x, V draw, Counters<D>& c) const {
    V r;
    if (Short(d, x, draw, c, r)) return r;
    return Apart(d, x, draw, c);
  }

  // The counts HotRound keeps: below AVX-512 on x86-64 both hot paths' own
  // (ShortLaneCounts, moved into the Counters where QuantizeSpan's hot loop
  // ends), else the Counters.
#if HWY_TARGET > HWY_AVX3
  using HotCounts = std::conditional_t<HWY_ARCH_X86_64, ShortLaneCounts<D>, Counters<D>>;
#else
  using HotCounts = Counters<D>;
#endif

  // The path most vectors of this loop take, alone (QuantizeSpan's inner
  // loop): with kShort == fpu the FPU short path (off x86-64 for zero or
  // storage-normal lanes only), else the ordinary pattern rounding. HotTakes
  // says whether it takes x, HotRound rounds x then.
  // a: x's magnitude, for HotRound.
  HWY_INLINE bool HotTakes(D d, V x, V& a) const {
    a = hn::And(x, hn::Set(d, Layout<U>::kMagnitude));
    if constexpr (kShort == ShortLanes::fpu && HWY_ARCH_X86_64) {
      return !AnyAboveLargest(a);
    } else if constexpr (kShort == ShortLanes::fpu) {
      return AllStorageNormalOrZero(d, a);
    } else {
      return AllOrdinary(d, a);
    }
  }
  HWY_INLINE V HotRound(D d, V x, V a, V draw, HotCounts& c) const {
    if constexpr (kShort == ShortLanes::fpu) {
      if constexpr (std::is_same_v<HotCounts, Counters<D>>) {
        return QuantizeShortLanesFpu<kMode>(d, k, x, a, hn::Eq(a, hn::Zero(d)), draw, c);
      } else {
        hn::Mask<D> exact;
        const V magnitude = ShortLanesFpuMagnitude<kMode>(d, k, x, a, draw, exact);
        const V r = hn::Or(magnitude, hn::Xor(x, a));
        c.template add<kMode>(d, k, exact, a, magnitude);
        return r;
      }
    } else if constexpr (std::is_same_v<HotCounts, Counters<D>>) {
      return QuantizeOrdinaryLanes<kMode>(d, k, x, draw, c.inexact_tally);
    } else {
      const V r = RoundOrdinaryLanes<kMode>(d, k, x, draw);
      c.add_ordinary(d, x, r);
      return r;
    }
  }

  // Whether every lane is zero or a normal number of the storage at most the
  // largest finite value (an unsigned wrap-around test).
  HWY_INLINE bool AllStorageNormalOrZero(D d, V a) const {
    const V storage_normal_span = hn::Set(d, static_cast<U>(k.format.largest_finite - Layout<U>::kHidden + 1));
    return hn::AllTrue(d, hn::Or(hn::Lt(hn::Sub(a, hn::Set(d, Layout<U>::kHidden)), storage_normal_span),
                                 hn::Eq(a, hn::Zero(d))));
  }

  // Whether a lane's magnitude a exceeds the largest finite value (a < 2^31:
  // one signed comparison).
  HWY_INLINE bool AnyAboveLargest(V a) const {
    const hn::RebindToSigned<D> di;
    using I = hn::TFromD<decltype(di)>;
    return !hn::AllFalse(di, hn::Gt(hn::BitCast(di, a), hn::Set(di, static_cast<I>(k.format.largest_finite))));
  }

  // Whether every lane is zero or ordinary: smallest_normal <= a <=
  // largest_finite (an unsigned wrap-around test).
  HWY_INLINE bool AllOrdinary(D d, V a) const {
    const V low = hn::Set(d, k.format.smallest_normal);
    const V span = hn::Set(d, k.ordinary_span);
    return hn::AllTrue(d, hn::Or(hn::Lt(hn::Sub(a, low), span), hn::Eq(a, hn::Zero(d))));
  }

  // A short path's rounding of x into r; false where a lane needs the
  // general lane code (Apart).
  HWY_INLINE bool Short(D d, V x, V draw, Counters<D>& c, V& r) const {
    const V a = hn::And(x, hn::Set(d, Layout<U>::kMagnitude));
    const V ordinary_low = hn::Set(d, k.format.smallest_normal);
    if constexpr (kShort != ShortLanes::pattern && HWY_ARCH_X86_64) {
      // Under ScopedMxcsr (no DAZ, no FTZ) the FPU path serves every lane at
      // most the largest finite value, binary32 subnormals and zeros included.
      if (AnyAboveLargest(a)) return false;
      const hn::RebindToSigned<D> di;
      const auto signed_a = hn::BitCast(di, a);
      const auto zero = hn::Eq(a, hn::Zero(d));
      if constexpr (kShort == ShortLanes::pattern_then_fpu) {
        // The pattern serves vectors with no lane below the format's smallest normal but zeros.
        const auto small = hn::AndNot(zero, hn::RebindMask(d, hn::Lt(signed_a, hn::BitCast(di, ordinary_low))));
        if (hn::AllFalse(d, small)) {
          r = QuantizeOrdinaryLanes<kMode>(d, k, x, draw, c.inexact_tally);
          return true;
        }
      }
      r = QuantizeShortLanesFpu<kMode>(d, k, x, a, zero, draw, c);
      return true;
    } else if (kShort != ShortLanes::pattern || k.subnormal_scale != 0) {
      // Where the host enabled QuantizeSubnormalLanes, one range test picks the
      // short paths: every lane zero or in [storage's smallest normal, largest finite].
      if (!AllStorageNormalOrZero(d, a)) return false;
      const auto zero = hn::Eq(a, hn::Zero(d));
      if constexpr (kShort == ShortLanes::fpu) {
        r = QuantizeShortLanesFpu<kMode>(d, k, x, a, zero, draw, c);
        return true;
      }
      // Zero lanes round to themselves in the ordinary code of every mode.
      const auto small = hn::AndNot(zero, hn::Lt(a, ordinary_low));
      if (hn::AllFalse(d, small)) {
        r = QuantizeOrdinaryLanes<kMode>(d, k, x, draw, c.inexact_tally);
      } else if constexpr (kShort == ShortLanes::pattern_then_fpu) {
        r = QuantizeShortLanesFpu<kMode>(d, k, x, a, zero, draw, c);
      } else {
        r = QuantizeSubnormalLanes<kMode>(d, k, x, a, small, zero, draw, c);
      }
      return true;
    }
    if (!AllOrdinary(d, a)) return false;
    r = QuantizeOrdinaryLanes<kMode>(d, k, x, draw, c.inexact_tally);
    return true;
  }

  // The general lane code for a vector that leaves the short paths: out of line (QuantizeLanesApart) where
  // registers are few (AVX2 and below: 16), inline on AVX-512, whose 32 hold the loop's counters either way
  // (there the call cost 5-10% in cache: stochastic binary16 on gradients 3.6 -> 3.25 G/s, 2026-11-28).
  HWY_INLINE V Apart(D d, V x, V draw, Counters<D>& c) const {
#if HWY_TARGET <= HWY_AVX3
    return QuantizeLanes<kMode>(d, k, x, draw, hn::FirstN(d, hn::Lanes(d)), c);
#else
    const LanesResult<D> result = QuantizeLanesApart<kMode>(d, k, x, draw, c);
    c = result.counters;
    return result.rounded;
#endif
  }

  const Kernel<U>& k;
};

// Not inlined: under ScopedMxcsr the call is what keeps the compiler from
// moving its floating-point operations across the MXCSR writes (no
// -frounding-math here).
template <RoundingMode kMode, class T, ShortLanes kShort>
HWY_NOINLINE QuantizeCounts QuantizeSpan(const KernelFor<T>& kernel, const T* in, T* out, std::size_t n, std::uint64_t first_index) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const Kernel<U> k = kernel;  // a local copy: the stores to `out` cannot alias it
  using D = hn::ScalableTag<U>;
  const D d;
  const hn::RebindToFloat<D> df;
  const hn::Rebind<std::uint32_t, D> d32;  // one 32-bit draw per lane
  using V = hn::Vec<D>;
  const std::size_t lanes = hn::Lanes(d);
  QuantizeCounts total;
  total.elements = n;
  const VectorRounder<kMode, D, kShort> round_vector{k};
  constexpr bool stochastic = kMode == RoundingMode::stochastic;
  std::size_t i = 0;
  while (i < n) {
    // Blocks of at most 2^17 elements keep the lane counts from wrapping (16
    // bits in ShortLaneCounts) and the random index's high word fixed; under
    // stochastic rounding its bits 16 to 31 too, for the hot loop's draws
    // (AlignedWindowDraws; window draws first took it from 2.49 to 2.6 G/s,
    // binary16 gradients, AVX2, 2026-11-29).
    const std::uint64_t index = first_index + i;
    const std::uint64_t window = std::uint64_t{1} << (stochastic ? 16 : 32);
    const std::uint64_t to_wrap = window - (index & (window - 1));
    const std::size_t block = static_cast<std::size_t>(std::min<std::uint64_t>({std::uint64_t{n - i}, to_wrap,
                                                                                std::uint64_t{1} << 17}));
    const auto high_term = hn::Set(d32, draw_high_term(k.key, index));
    const std::uint32_t window_term = draw_window_term(k.key, index);
    const std::uint32_t index_word = static_cast<std::uint32_t>(index);
    // The random indices' low words of the lanes of the vector at `at`, from a hoisted iota (Highway 1.0.3's
    // Iota goes through memory on x86: per vector it made stochastic binary16 from double storage on AVX-512
    // 2.7x slower, 1.10 -> 0.41 G/s in cache, where most vectors leave the hot loop, 2026-11-29).
    const auto lane_iota = hn::Iota(d32, 0);
    auto lane_words = [&](std::size_t at) {
      return hn::Add(lane_iota, hn::Set(d32, index_word + static_cast<std::uint32_t>(at)));
    };
    Counters<D> c = Counters<D>::zero(d);
    std::size_t j = 0;
    // Up to one vector of elements through a full-width buffer and the general lane code.
    auto partial = [&](std::size_t count) {
      HWY_ALIGN T buffer[HWY_MAX_BYTES / sizeof(T)] = {};
      std::memcpy(buffer, in + i + j, count * sizeof(T));
      const V x = hn::BitCast(d, hn::Load(df, buffer));
      const V draw = stochastic ? LaneDraws(d, d32, k.key, lane_words(j), high_term) : hn::Zero(d);
      hn::Store(hn::BitCast(df, QuantizeLanes<kMode>(d, k, x, draw, hn::FirstN(d, count), c)), df, buffer);
      std::memcpy(out + i + j, buffer, count * sizeof(T));
      j += count;
    };
    // Whole vectors, each written by `store` (one loop per kind of store: no branch per vector).
    // Counters, addresses and the position as locals of the loop: the stores through `out` may alias
    // anything captured by reference, which would keep them in memory (a read-modify-write per vector).
    // `aligned_draws`: each vector's first index is a multiple of the lane count (AlignedWindowDraws), else
    // the draws step their indices (SteppedWindowDraws).
    auto whole_vectors = [&](auto store, auto aligned_draws) {
      constexpr bool kAlignedDraws = decltype(aligned_draws)::value;
      Counters<D> lc = c;
      const T* const src = in + i;
      T* const dst = out + i;
      const std::size_t end = block;
      std::size_t at = j;
      // The path most vectors take in a loop of its own, every other path
      // outside it: the rare paths' constants and calls (every vector register
      // is the caller's to save across a call) otherwise made GCC 12 rebuild
      // the hot path's constants every vector (AVX2 and AVX3, 2026-11-29).
      // The hot path's own copy of the kernel: the general path's call takes the
      // address of k, after which a store through `out` may write it, and GCC 12
      // reloaded k's fields and recomputed what it derives from them every vector.
      const Kernel<U> hot_k = k;
      HWY_DASSERT(!stochastic || !kAlignedDraws || j >= end || (index_word + j) % lanes == 0);
      const auto lane_products = AlignedLaneProducts(d32, window_term, lanes);
      const auto window_term_vector = hn::Set(d32, window_term);
      const auto step = hn::Set(d32, static_cast<std::uint32_t>(lanes));
      float product_slot = 0;
      const VectorRounder<kMode, D, kShort> hot_rounder{hot_k};
      using HotCounts = typename decltype(round_vector)::HotCounts;
      constexpr bool kHotCountsApart = !std::is_same_v<HotCounts, Counters<D>>;
      HotCounts own_hot_counts = HotCounts::zero(d);  // unused where HotRound counts in lc
      HotCounts& hot_counts = [&]() -> HotCounts& {
        if constexpr (kHotCountsApart) return own_hot_counts;
        else return lc;
      }();
      // Each vector is tested before the last one's rounding ends the iteration, so that the loop
      // leaves only at its end, after the counts' updates: left in the middle, it made GCC 12 copy
      // or spill the counts every vector to keep their values for the exit (AVX2, 2026-11-29).
      while (at + lanes <= end) {
        const std::size_t hot_begin = at;
        V x = hn::BitCast(d, hn::LoadU(df, src + at)), a;
        if (hot_rounder.HotTakes(d, x, a)) {
          [[maybe_unused]] auto words = lane_words(at);  // SteppedWindowDraws' indices
          for (;;) {
            V draw = hn::Zero(d);
            if constexpr (stochastic && kAlignedDraws) {
              const std::uint32_t first_product = AlignedFirstProduct(index_word + static_cast<std::uint32_t>(at), window_term, lanes);
              draw = AlignedWindowDraws(d, d32, first_product, lane_products, high_term, product_slot);
            } else if constexpr (stochastic) {
              draw = SteppedWindowDraws(d, d32, words, window_term_vector, high_term);
              words = hn::Add(words, step);
            }
            store(hn::BitCast(df, hot_rounder.HotRound(d, x, a, draw, hot_counts)), dst + at);
            at += lanes;
            if (at + lanes > end) break;
            x = hn::BitCast(d, hn::LoadU(df, src + at));
            if (!hot_rounder.HotTakes(d, x, a)) break;
          }
        }
        if constexpr (kHotCountsApart) own_hot_counts.vectors += static_cast<std::uint32_t>((at - hot_begin) / lanes);
        if (at + lanes > end) break;
        // x: the vector at `at`, which the hot path does not take.
        const V draw = stochastic ? LaneDraws(d, d32, k.key, lane_words(at), high_term) : hn::Zero(d);
        store(hn::BitCast(df, round_vector(d, x, draw, lc)), dst + at);
        at += lanes;
      }
      if constexpr (kHotCountsApart) own_hot_counts.template MoveInto<kMode>(d, lc);
      j = at;
      c = lc;
    };
    // Streaming stores take whole aligned vectors: the elements up to the first such output go through
    // `partial`. Without them, under stochastic rounding, so do the elements up to the first index that is a
    // multiple of the lane count (AlignedWindowDraws). With them, where the output's alignment and the
    // index's differ (the usual case: large allocations start 16 bytes into a page), the hot loop's draws
    // step their indices instead (SteppedWindowDraws, two vector operations more per vector).
    std::size_t to_aligned_index = 0;
    if constexpr (stochastic) to_aligned_index = (lanes - index_word % lanes) % lanes;
    const std::size_t vector_bytes = lanes * sizeof(T);
    const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(out + i) % vector_bytes;
    const std::size_t to_aligned_output = misaligned == 0 ? 0 : (vector_bytes - misaligned) / sizeof(T);
    if (k.streaming_stores) {
      if (to_aligned_output != 0) partial(std::min(block, to_aligned_output));
      const auto stream = [&](hn::Vec<decltype(df)> r, T* at) { hn::Stream(r, df, at); };
      if (!stochastic || to_aligned_output == to_aligned_index) whole_vectors(stream, std::true_type{});
      else if constexpr (stochastic) whole_vectors(stream, std::false_type{});
    } else {
      // (Under `if constexpr`: taken by every mode, this call made AVX-512 toward-zero on bfloat16 8%
      // slower at 16M, 5.3 -> 4.9 G/s, its hot loop's instructions unchanged, 2026-11-29.)
      if constexpr (stochastic) {
        if (to_aligned_index != 0) partial(std::min(block, to_aligned_index));
      }
      whole_vectors([&](hn::Vec<decltype(df)> r, T* at) { hn::StoreU(r, df, at); }, std::true_type{});
    }
    if (j < block) partial(block - j);  // the tail
    HWY_ALIGN U lane_counts[5][HWY_MAX_BYTES / sizeof(U)] = {};
#if HWY_TARGET <= HWY_AVX3
    hn::Store(c.inexact, d, lane_counts[0]);
    hn::Store(c.flushed, d, lane_counts[1]);
    hn::Store(c.subnormal, d, lane_counts[2]);
#endif
    hn::Store(c.overflow, d, lane_counts[3]);
    hn::Store(c.nan, d, lane_counts[4]);
    total.inexact += c.inexact_tally.total(d);
    total.flushed_to_zero += c.flushed_tally.total(d);
    total.subnormal += c.subnormal_tally.total(d);
    for (std::size_t l = 0; l < lanes; ++l) {
      total.inexact += lane_counts[0][l];
      total.flushed_to_zero += lane_counts[1][l];
      total.subnormal += lane_counts[2][l];
      total.overflow += lane_counts[3][l];
      total.nan += lane_counts[4][l];
    }
    i += block;
  }
  if (k.streaming_stores) hwy::FlushStream();  // the streamed stores ordered before the caller's next ones
  return total;
}

// Whether more than about 1 element in 512 of x[0, n) lies below the format's
// smallest normal (and is not zero), judged on 256 elements spread over it:
// then QuantizeShortLanesFpu serves every short-path vector best; else most
// vectors round on the pattern, and the FPU takes the rest. Only the speed
// depends on the answer, never a bit.
template <class T, class U>
bool MostlyBelowNormal(const Kernel<U>& k, const T* x, std::size_t n) {
  const std::size_t stride = std::max<std::size_t>(1, n / 256);
  std::size_t sampled = 0, small = 0;
  for (std::size_t i = 0; i < n; i += stride, ++sampled) {
    const U a = std::bit_cast<U>(x[i]) & Layout<U>::kMagnitude;
    small += a != 0 && a < k.format.smallest_normal;
  }
  return small * 512 > sampled;
}

template <RoundingMode kMode, class T>
QuantizeCounts QuantizeMode(const KernelFor<T>& k, const T* in, T* out, std::size_t n, std::uint64_t first) {
  using D = hn::ScalableTag<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  if constexpr (kFpuShortPath<kMode, D>) {
    // The host's fpu_magic_offset; off x86-64, nearest-even also needs the FPU rounding to nearest.
    if (k.fpu_magic_offset != 0 && (HWY_ARCH_X86_64 || k.subnormal_magic != 0)) {
#if HWY_ARCH_X86_64
      const ScopedMxcsr mxcsr(kSumRounding<kMode>);
#endif
      if (MostlyBelowNormal(k, in, n)) return QuantizeSpan<kMode, T, ShortLanes::fpu>(k, in, out, n, first);
      return QuantizeSpan<kMode, T, ShortLanes::pattern_then_fpu>(k, in, out, n, first);
    }
  }
  return QuantizeSpan<kMode, T, ShortLanes::pattern>(k, in, out, n, first);
}

template <class T>
QuantizeCounts QuantizeAnyMode(const KernelFor<T>& k, const T* in, T* out, std::size_t n, std::uint64_t first) {
  switch (k.mode) {
    case RoundingMode::nearest_even: return QuantizeMode<RoundingMode::nearest_even>(k, in, out, n, first);
    case RoundingMode::nearest_away: return QuantizeMode<RoundingMode::nearest_away>(k, in, out, n, first);
    case RoundingMode::toward_zero: return QuantizeMode<RoundingMode::toward_zero>(k, in, out, n, first);
    case RoundingMode::toward_positive: return QuantizeMode<RoundingMode::toward_positive>(k, in, out, n, first);
    case RoundingMode::toward_negative: return QuantizeMode<RoundingMode::toward_negative>(k, in, out, n, first);
    case RoundingMode::odd: return QuantizeMode<RoundingMode::odd>(k, in, out, n, first);
    case RoundingMode::stochastic: return QuantizeMode<RoundingMode::stochastic>(k, in, out, n, first);
  }
  return {};
}

QuantizeCounts QuantizeFloat(const Kernel<std::uint32_t>& k, const float* in, float* out, std::size_t n,
                             std::uint64_t first) {
  return QuantizeAnyMode<float>(k, in, out, n, first);
}
QuantizeCounts QuantizeDouble(const Kernel<std::uint64_t>& k, const double* in, double* out, std::size_t n,
                              std::uint64_t first) {
  return QuantizeAnyMode<double>(k, in, out, n, first);
}

// Block elements to nearest even, saturating (every element format of the
// block-scaled presets: gradual underflow, few fraction bits), with the FPU's
// own rounding. The element's quantum at |y| is 2^q, q the exponent of |y|'s
// binade (at least emin) minus the mantissa bits; adding M = 2^(q + 23)
// (above |y|, so the sum lies in [M, 2M) whose binary32 spacing is 2^q)
// rounds |y| to a multiple of 2^q to nearest even, exactly as the element
// format does, and subtracting M is exact. Values from 2^(emax + 1) up
// saturate whatever they round to, so they are first clamped there (the sum
// stays finite). A sum above the largest element is an overflow (saturated).
// The sign goes back on last (-0 for negative values that round to zero).
// |y|'s pattern, clamped to 2^(emax + 1) where every element saturates (the
// sum stays finite) when `capped`: NVFP4's clamped block scales and a tile's
// underflowed scale can take |y| there; the MX rules keep |y| below 2^(emax + 1).
template <class D>
HWY_INLINE hn::Vec<D> BlockMagnitude(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> y, bool capped) {
  const auto a = hn::And(y, hn::Set(d, 0x7FFFFFFFu));
  return capped ? hn::Min(a, hn::Set(d, ((k.format.largest_finite >> 23) + 1) << 23)) : a;
}

// The rounded magnitude r saturated to the largest element (counting the
// overflows) into `element_magnitude`; returns it with y's sign back on.
template <class D, class VF>
HWY_INLINE hn::Vec<D> SaturateWithSign(D d, const Kernel<std::uint32_t>& k, VF r, hn::Vec<D> y, Tally<D>& saturated,
                                       VF& element_magnitude) {
  const hn::RebindToFloat<D> df;
  const auto largest = hn::BitCast(df, hn::Set(d, k.format.largest_finite));
  saturated.add(d, hn::RebindMask(d, hn::Gt(r, largest)));
  element_magnitude = hn::Min(r, largest);
  return hn::Or(hn::BitCast(d, element_magnitude), hn::And(y, hn::Set(d, 0x80000000u)));
}

// M's pattern from |y|'s: |y|'s exponent field (at least emin's), plus 23 -
// mantissa bits in the exponent.
template <class D, class VF>
HWY_INLINE hn::Vec<D> NearestBlockElements(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> y, bool capped,
                                           Tally<D>& saturated, VF& element_magnitude) {
  const hn::RebindToFloat<D> df;
  const auto a = BlockMagnitude(d, k, y, capped);
  const auto binade = hn::Max(hn::And(a, hn::Set(d, 0x7F800000u)), hn::Set(d, k.format.min_normal_exponent << 23));
  const auto magic = hn::BitCast(df, hn::Add(binade, hn::Set(d, (23u - k.format.mantissa_bits) << 23)));
  const auto fa = hn::BitCast(df, a);
  return SaturateWithSign(d, k, hn::Sub(hn::Add(fa, magic), magic), y, saturated, element_magnitude);
}

// The common case of StochasticBlockElements: every lane zero or in the
// element's normal binades, and every bit of the draw that meets the fraction
// kept (random bits >= q = 23 - mantissa bits, the quantum's position). The
// fraction is then |y|'s low q bits, and "fraction 2^(32 - q) + draw carries
// out of 32 bits" is "|y| + (draw >> (32 - q)) carries into bit q" (2^q -
// fraction is an integer): the sum with its low q bits cleared is the result,
// a carry across a binade giving the next binade's pattern. Tried only for
// elements with at least 8 normal binades (FP8): with FP4's and FP6's few, most
// vectors of a block hold a subnormal element, and the test only cost (NVFP4
// stochastic 25% slower with it on an AVX2 VM, 2026-11-28). Decided once per
// run (BlockFlags::integer_carry), not per vector.
inline bool IntegerCarryElements(const Kernel<std::uint32_t>& k) {
  const int q = 23 - static_cast<int>(k.format.mantissa_bits);
  const bool wide = (k.format.largest_finite >> 23) >= k.format.min_normal_exponent + 7;
  return wide && (k.random_mask >> (32 - q)) == (1u << q) - 1;
}

// Block elements rounded stochastically, saturating (the same formats): the
// reference's decision (Carry: the 0.32 fraction of |y| below the element's
// quantum, plus the draw, carries out of 32 bits), and a carry adds one
// quantum, 2^(binade - mantissa bits), in binary32 exactly.
template <class D, class VF>
HWY_INLINE hn::Vec<D> StochasticBlockElements(D d, const Kernel<std::uint32_t>& k, hn::Vec<D> y, hn::Vec<D> draw,
                                              bool capped, bool integer_carry, Tally<D>& saturated,
                                              VF& element_magnitude) {
  const hn::RebindToFloat<D> df;
  const hn::RebindToSigned<D> di;
  const auto a = BlockMagnitude(d, k, y, capped);
  if (integer_carry) {
    const int q = 23 - static_cast<int>(k.format.mantissa_bits);
    const auto normal_or_zero = hn::RebindMask(
        d, hn::Or(hn::Gt(hn::BitCast(di, a),
                         hn::Set(di, static_cast<std::int32_t>(k.format.min_normal_exponent << 23) - 1)),
                  hn::Eq(hn::BitCast(di, a), hn::Zero(di))));
    if (hn::AllTrue(d, normal_or_zero)) {
      const auto rounded = hn::AndNot(hn::Set(d, (1u << q) - 1), hn::Add(a, hn::ShiftRightSame(draw, 32 - q)));
      return SaturateWithSign(d, k, hn::BitCast(df, rounded), y, saturated, element_magnitude);
    }
  }
  // Otherwise on the FPU, every step exact: with Q the quantum at |y| (2^(binade - mantissa bits), binade at
  // least the element's emin: the subnormal quantum below it), z = |y| / Q (a power of two), its integer part
  // t and fraction z - t (Sterbenz); the fraction's top 32 bits are the reference's 0.32 fraction, and a carry
  // adds one quantum to t Q. Binary32 subnormal |y| scale up exactly; zero gives zero.
  const auto binade = hn::Max(hn::And(a, hn::Set(d, 0x7F800000u)), hn::Set(d, k.format.min_normal_exponent << 23));
  const auto quantum_bits = hn::Sub(binade, hn::Set(d, k.format.mantissa_bits << 23));
  const auto z = hn::Mul(hn::BitCast(df, a), hn::BitCast(df, hn::Sub(hn::Set(d, 254u << 23), quantum_bits)));
  const auto t = hn::Trunc(z);
  const auto carry = hn::RebindMask(df, Carry(d, k, FractionBits(d, df, hn::Sub(z, t)), draw));
  const auto rounded = hn::Mul(hn::Add(t, hn::IfThenElseZero(carry, hn::Set(df, 1.0f))), hn::BitCast(df, quantum_bits));
  return SaturateWithSign(d, k, rounded, y, saturated, element_magnitude);
}

// Whether NearestBlockElements (nearest-even) or StochasticBlockElements
// rounds this kernel's elements: the FPU and per-lane shifts instead of the
// general vector rounder.
inline bool DirectBlockElements(const Kernel<std::uint32_t>& k) {
  return (k.mode == RoundingMode::nearest_even || k.mode == RoundingMode::stochastic) && !k.format.flush_to_zero &&
         k.format.saturate && k.format.mantissa_bits <= 22 && (k.format.largest_finite >> 23) + 1 < 255 - 23;
}

// A block kernel's counts (Tally: lanes or scalars, per target). Zeros, not
// nonzeros, are counted: on AVX2 "not equal" is an equality and a negation.
// The nonzero count is then the lanes looked at less `zeros` (less nothing
// where the caller counted x's zeros: BlockFlags::zeros_known).
template <class D>
struct BlockTallies {
  Tally<D> zeros, lost, saturated;  // zeros: x zero or (NVFP4) not finite, padding lanes included
  std::uint64_t lanes = 0;          // lanes looked at, padding included

  static BlockTallies zero(D d) { return {{hn::Zero(d)}, {hn::Zero(d)}, {hn::Zero(d)}, 0}; }
  void add(const BlockTallies& other) {
    zeros.add(other.zeros);
    lost.add(other.lost);
    saturated.add(other.saturated);
    lanes += other.lanes;
  }
};

// What a run of blocks does, fixed for the run (constants in the direct
// loops, where a BlockLoop names them): tiles divide by their scale, NVFP4
// multiplies by its tensor scale too (two_step) and may hold infinities,
// elements round directly (DirectBlockElements) or through the vector
// rounder, integer elements have no -0.
struct BlockFlags {
  bool tile = false, two_step = false, infinities = false, direct = false, integer = false;
  bool integer_carry = false;  // stochastic elements may take the integer carry (IntegerCarryElements)
  // The caller counted x's zeros (block_amax_bits, a finite NVFP4 tensor): zeros go uncounted here and
  // `lost` counts every zero element, padding and zero x included (x = 0 gives a zero element).
  bool zeros_known = false;
};

// One vector of a block: y = x op scale, its counts, its element (`count`
// valid lanes; the rest are padding zeros) into `element`, and the dequantized
// value. An integer element's zero is +0 (its code holds no -0; the
// reference's round_integer), where the pattern rounding keeps y's sign.
template <RoundingMode kMode, class D, class VF = hn::Vec<hn::RebindToFloat<D>>>
HWY_INLINE VF BlockVector(D d, const Kernel<std::uint32_t>& k, const VectorRounder<kMode, D>& round_vector,
                          Counters<D>& c, VF x, VF factor, VF dequant, VF tensor_scale, const BlockFlags& flags,
                          bool zero_tile, hn::Vec<D> draw, std::size_t count, BlockTallies<D>& t, VF& element) {
  const bool tile = flags.tile, two_step = flags.two_step, infinities = flags.infinities;
  const bool direct_elements = flags.direct, integer_elements = flags.integer;
  using V = hn::Vec<D>;
  const hn::RebindToFloat<D> df;
  VF y;
  if (tile) {
    y = hn::Div(x, factor);
    if (zero_tile) y = hn::IfThenElse(hn::Eq(x, hn::Zero(df)), x, y);  // zeros keep their signs
  } else {
    y = hn::Mul(x, factor);
  }
  const V magnitude = hn::Set(d, 0x7FFFFFFFu);
  // A block that is not NaN holds no NaN, and no infinity but under NVFP4 (whose block scales saturate):
  // `infinities` where the tensor holds some.
  const auto zero_x = hn::RebindMask(d, hn::Eq(x, hn::Zero(df)));
  const auto uncounted =
      infinities ? hn::Or(zero_x, hn::Eq(hn::And(hn::BitCast(d, x), magnitude), hn::Set(d, 0x7F800000u))) : zero_x;
  if (!flags.zeros_known) t.zeros.add(d, uncounted);
  V r;
  if (direct_elements) {  // lost: a nonzero x whose element is 0 (y itself 0 included; infinities saturate), or
                          // with zeros_known every zero element
    const bool capped = tile || two_step;
    VF r_magnitude;
    if constexpr (kMode == RoundingMode::stochastic)
      r = StochasticBlockElements(d, k, hn::BitCast(d, y), draw, capped, flags.integer_carry, t.saturated,
                                  r_magnitude);
    else
      r = NearestBlockElements(d, k, hn::BitCast(d, y), capped, t.saturated, r_magnitude);
    const auto zero_r = hn::RebindMask(d, hn::Eq(r_magnitude, hn::Zero(df)));
    t.lost.add(d, flags.zeros_known ? zero_r : hn::AndNot(zero_x, zero_r));
    if (integer_elements) r = hn::IfThenZeroElse(zero_r, r);
  } else {  // the rounder counts y != 0 that become 0; `lost` the y that are 0 already
    t.lost.add(d, hn::AndNot(uncounted, hn::Eq(hn::And(hn::BitCast(d, y), magnitude), hn::Zero(d))));
    r = count == hn::Lanes(d) ? round_vector(d, hn::BitCast(d, y), draw, c)
                              : QuantizeLanes<kMode>(d, k, hn::BitCast(d, y), draw, hn::FirstN(d, count), c);
    if (integer_elements) r = hn::IfThenZeroElse(hn::Eq(hn::And(r, magnitude), hn::Zero(d)), r);
  }
  element = hn::BitCast(df, r);
  VF v = hn::Mul(element, dequant);
  if (two_step) v = hn::Mul(v, tensor_scale);  // element * sb is exact; one rounding here
  return v;
}

// The draws of the lanes at indices index, index + 1, ...: the vector hash,
// or lane by lane where the lanes' high words differ (a multiple of 2^32
// inside). `iota`: 0, 1, 2, ... (Highway's Iota goes through memory on x86:
// a stalled store-to-load forward per vector).
template <class D>
HWY_INLINE hn::Vec<D> BlockDraws(D d, DrawKey key, std::uint64_t index, hn::Vec<D> iota) {
  const std::size_t lanes = hn::Lanes(d);
  if ((index >> 32) == ((index + lanes - 1) >> 32))
    return Draws(d, key, hn::Add(iota, hn::Set(d, static_cast<std::uint32_t>(index))),
                 hn::Set(d, draw_high_term(key, index)));
  HWY_ALIGN std::uint32_t draws[HWY_MAX_BYTES / sizeof(std::uint32_t)];
  for (std::size_t l = 0; l < lanes; ++l) draws[l] = random_draw(key, index + l);
  return hn::Load(d, draws);
}

// Several blocks' scales at once: lane l of the result is the largest |x| of
// block l of `lanes` consecutive blocks of `block` values (block a multiple of
// the lanes). Each block's lanes are reduced to one vector, then pairs of
// vectors halve by even/odd lanes: after log2(lanes) rounds lane l holds
// block l (a transpose and a max in one). For fixed-width targets (x86).
// `zeros`, where given, counts the zeros among the values too.
template <class D>
HWY_INLINE hn::Vec<D> GroupAmax(D d, const float* in, std::size_t block, Tally<D>* zeros = nullptr) {
  const hn::RebindToFloat<D> df;
  constexpr std::size_t kLanes = hn::MaxLanes(D());  // x86 targets: the actual lane count, a constant
  const auto magnitude = hn::Set(d, 0x7FFFFFFFu);
  const auto load = [&](const float* at) {
    const auto a = hn::And(hn::BitCast(d, hn::LoadU(df, at)), magnitude);
    if (zeros != nullptr) zeros->add(d, hn::Eq(a, hn::Zero(d)));
    return a;
  };
  hn::Vec<D> m[kLanes];  // in registers (32 on AVX-512)
  HWY_UNROLL(16)
  for (std::size_t b = 0; b < kLanes; ++b) {
    const float* x = in + b * block;
    m[b] = load(x);
    for (std::size_t j = kLanes; j < block; j += kLanes) m[b] = hn::Max(m[b], load(x + j));
  }
#if HWY_TARGET != HWY_SCALAR
  HWY_UNROLL(16)
  for (std::size_t count = kLanes; count > 1; count /= 2) {
    HWY_UNROLL(16)
    for (std::size_t i = 0; i < count / 2; ++i)
      m[i] = hn::Max(hn::ConcatEven(d, m[2 * i + 1], m[2 * i]), hn::ConcatOdd(d, m[2 * i + 1], m[2 * i]));
  }
#endif
  return m[0];
}

// 2^k for k in [-127, 127] as binary32 (2^-127 subnormal): power_of_two's bits.
template <class DI>
HWY_INLINE hn::Vec<DI> PowerOfTwoBits(DI di, hn::Vec<DI> k) {
  return hn::IfThenElse(hn::Eq(k, hn::Set(di, -127)), hn::Set(di, 0x400000),
                        hn::ShiftLeft<23>(hn::Add(k, hn::Set(di, 127))));
}

// block_params (block_scaling.hpp) of `lanes` blocks at once from their amax
// bits, for the power-of-two and NVFP4 rules without a NaN tensor: the same
// binary32 operations lane by lane (the fast-path tests compare every scale
// and count with the reference). Writes each lane's factor, dequant (aligned),
// code (unaligned) and whether it is a NaN block (aligned); returns how many
// scales were clamped.
template <class D>
HWY_INLINE std::size_t GroupParams(D d, const BlockRule& rule, hn::Vec<D> amax, float* factor, float* dequant,
                                   std::uint32_t* code, std::uint32_t* nan) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToFloat<D> df;
  using VI = hn::Vec<decltype(di)>;
  if (rule.kind == BlockKind::power_of_two) {
    const auto magnitude = hn::BitCast(di, amax);  // below 2^31: signed compares
    const auto is_nan = hn::RebindMask(d, hn::Gt(magnitude, hn::Set(di, 0x7F7FFFFF)));
    const auto zero = hn::Eq(amax, hn::Zero(d));
    const auto normal = hn::RebindMask(d, hn::Gt(magnitude, hn::Set(di, 0x007FFFFF)));
    // A subnormal through an integer-to-float conversion (exact below 2^23): its exponent is floor(log2)
    // + 149 and its significand is the normalized one.
    const auto f = hn::IfThenElse(normal, amax, hn::BitCast(d, hn::ConvertTo(df, hn::BitCast(di, amax))));
    VI log2 = hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(f)), hn::Set(di, 127));
    log2 = hn::IfThenElse(hn::RebindMask(di, normal), log2, hn::Sub(log2, hn::Set(di, 149)));
    VI e = hn::Sub(log2, hn::Set(di, rule.emax));
    if (rule.ceil) {  // significand 2^emax > largest
      const auto sig = hn::BitCast(df, hn::Or(hn::And(f, hn::Set(d, 0x7FFFFFu)), hn::Set(d, 0x3F800000u)));
      const auto up = hn::Gt(hn::Mul(sig, hn::Set(df, power_of_two(rule.emax))), hn::Set(df, rule.largest));
      e = hn::Sub(e, hn::VecFromMask(di, hn::RebindMask(di, up)));
    }
    e = hn::IfThenElse(hn::RebindMask(di, zero), hn::Set(di, -127), e);
    const auto out = hn::Or(hn::Lt(e, hn::Set(di, -127)), hn::Gt(e, hn::Set(di, 127)));
    const std::size_t clamped = hn::CountTrue(di, hn::AndNot(hn::RebindMask(di, is_nan), out));
    e = hn::Min(hn::Max(e, hn::Set(di, -127)), hn::Set(di, 127));
    hn::Store(hn::BitCast(df, PowerOfTwoBits(di, hn::Neg(e))), df, factor);
    hn::Store(hn::BitCast(df, PowerOfTwoBits(di, e)), df, dequant);
    hn::StoreU(hn::IfThenElse(is_nan, hn::Set(d, 0xFFu), hn::BitCast(d, hn::Add(e, hn::Set(di, 127)))), d, code);
    hn::Store(hn::IfThenElseZero(is_nan, hn::Set(d, 1u)), d, nan);
    return clamped;
  }
  // NVFP4 (no NaN in the tensor): s = (amax / 6) S_enc (or TE's amax (S_enc (1/6))), at most FLT_MAX,
  // clamped to 448, rounded to E4M3 (nearest even): 3 fraction bits from 2^-6 up, multiples of 2^-9 below.
  const auto a = hn::BitCast(df, amax);
  const float one_sixth = 1.0f / 6.0f;
  auto s = rule.te_order ? hn::Mul(a, hn::Set(df, rule.encode * one_sixth))
                         : hn::Mul(hn::Div(a, hn::Set(df, 6.0f)), hn::Set(df, rule.encode));
  s = hn::Min(s, hn::Set(df, FLT_MAX));
  const auto over = hn::Gt(s, hn::Set(df, 448.0f));
  s = hn::Min(s, hn::Set(df, 448.0f));
  const auto bits = hn::BitCast(d, s);
  const auto half_even = hn::Add(hn::Set(d, 0x7FFFFu), hn::And(hn::ShiftRight<20>(bits), hn::Set(d, 1u)));
  const auto normal = hn::BitCast(df, hn::And(hn::Add(bits, half_even), hn::Set(d, ~0xFFFFFu)));
  const auto subnormal = hn::Sub(hn::Add(s, hn::Set(df, 16384.0f)), hn::Set(df, 16384.0f));  // ulp of 2^14: 2^-9
  const auto is_normal = hn::Ge(s, hn::Set(df, 0x1p-6f));
  const auto sb = hn::IfThenElse(is_normal, normal, subnormal);
  const auto underflow = hn::And(hn::Eq(sb, hn::Zero(df)), hn::Gt(a, hn::Zero(df)));
  const std::size_t clamped = hn::CountTrue(df, hn::Or(over, underflow));
  const auto sb_bits = hn::BitCast(d, sb);
  const auto normal_code = hn::Or(hn::ShiftLeft<3>(hn::Sub(hn::ShiftRight<23>(sb_bits), hn::Set(d, 120u))),
                                  hn::And(hn::ShiftRight<20>(sb_bits), hn::Set(d, 7u)));
  const auto subnormal_code = hn::BitCast(d, hn::ConvertTo(di, hn::Mul(sb, hn::Set(df, 512.0f))));
  hn::StoreU(hn::IfThenElse(hn::RebindMask(d, is_normal), normal_code, subnormal_code), d, code);
  const auto enc = hn::Div(hn::Set(df, 1.0f), hn::Mul(sb, hn::Set(df, rule.tensor_scale)));
  hn::Store(hn::Min(enc, hn::Set(df, FLT_MAX)), df, factor);
  hn::Store(sb, df, dequant);
  hn::Store(hn::Zero(d), d, nan);
  return clamped;
}

// Which loop quantizes a run of blocks: `general` tests the flags per vector
// (any element rounding); the others round elements directly
// (DirectBlockElements) with one kind of scale (NVFP4's split by whether the
// tensor holds infinities, which are neither zero nor counted as nonzero; the
// finite one leaves x's zeros to the caller, BlockFlags::zeros_known, and is
// taken only where the caller counted them: with block_amax).
enum class BlockLoop { general, power_of_two, nvfp4, nvfp4_infinities, tile };
template <BlockLoop kLoop>
using LoopTag = std::integral_constant<BlockLoop, kLoop>;

template <RoundingMode kMode>
void QuantizeBlocksSpan(const Kernel<std::uint32_t>& kernel, const BlockRule& rule, const BlockParams* given,
                        const float* in, float* out, float* elements, std::size_t n, std::size_t block,
                        std::uint64_t first_index, const std::uint32_t* block_amax, std::uint32_t* codes,
                        BlockKernelCounts& total) {
  using U = std::uint32_t;
  const Kernel<U> k = kernel;
  using D = hn::ScalableTag<U>;
  const D d;
  const hn::RebindToFloat<D> df;
  using V = hn::Vec<D>;
  using VF = hn::Vec<decltype(df)>;
  const std::size_t lanes = hn::Lanes(d);
  const V magnitude = hn::Set(d, Layout<U>::kMagnitude);
  Counters<D> c = Counters<D>::zero(d);
  BlockTallies<D> tallies{{hn::Zero(d)}, {hn::Zero(d)}, {hn::Zero(d)}, 0};
  std::uint64_t nan_nonzero = 0;  // finite nonzero values of NaN blocks
  const bool tile = rule.kind == BlockKind::tile, two_step = rule.kind == BlockKind::nvfp4;
  const bool direct_elements = DirectBlockElements(k), integer_elements = rule.integer_elements;
  const bool infinities = two_step && !rule.tensor_finite;
  // Stochastic rounding: each vector's draws computed where they are used (a
  // separate pass over a buffer of draws measured slower, 2026-11-26).
  constexpr bool stochastic = kMode == RoundingMode::stochastic;
  const float tensor_scale = rule.tensor_scale;
  const V iota = hn::Iota(d, 0);
  // A group's input is fetched this many floats ahead (2 KiB): GroupAmax's loads (or, given block_amax,
  // the elements') are the first touch of every line, and without it a sample of them missed all the way to memory (perf on an AVX-512 AMD EPYC
  // VM, 2026-11-28: MXFP8 at 16M floats 2.3 -> 4.2-4.7 G/s, NVFP4 2.3 -> 2.7 G/s; 256 and 1024 floats
  // were no better, prefetching the output for writing no different).
  constexpr std::size_t kPrefetchAhead = 512, kLineFloats = 64 / sizeof(float);
  // The elements of blocks [begin, end), block i with scale ps[i]; `tail_in`: the last block's last
  // (end - begin) mod lanes values, zero-padded. Or, `grouped`, whole groups of `lanes` blocks of whole
  // vectors from `begin` (a multiple of lanes * block), each group's scales computed together on vectors
  // (GroupAmax or block_amax, GroupParams: a per-block cross-lane reduction and scalar scale cost as much as the block's
  // elements), and where the elements round directly, the block a power-of-two number of vectors and no
  // block NaN, the group's elements in one flat loop, each vector's scale broadcast from the group's arrays
  // (a block of NVFP4 on AVX2 is two vectors: a loop per block costs as much again).
  // Counters, kernel, rounder and the arrays' addresses are copied into locals for the run: vector stores
  // through `out` may alias any memory, which would keep them in memory, reloaded or updated there for
  // every vector, instead of in registers. The groups loop inside the run: copying the counters back after
  // every group cost 15% of NVFP4's time on AVX-512 (8-byte stores read back by 64-byte loads, a failed
  // store-to-load forward each; perf, 2026-11-28).
  // The common loops (elements rounded directly, one kind of scale) are compiled each with its flags
  // constant: a loop that tests them per vector keeps too many values live for AVX2's 16 registers.
  const auto quantize_run_as = [&](auto loop, std::size_t begin, std::size_t end, const BlockParams* ps,
                                   const float* tail_in, bool grouped) {
    constexpr BlockLoop kLoop = decltype(loop)::value;
    const Kernel<U> lk = k;
    const VectorRounder<kMode, D> rounder{lk};
    Counters<D> lc = c;
    BlockTallies<D> lt = tallies;
    const float* const x_in = in;
    float* const x_out = out;
    float* const x_elements = elements;
    // NVFP4's elements are E2M1: never integers, too few binades for the integer carry (constants, so the
    // loop tests neither per vector).
    constexpr bool kNvfp4 = kLoop == BlockLoop::nvfp4 || kLoop == BlockLoop::nvfp4_infinities;
    const BlockFlags flags =
        kLoop == BlockLoop::general
            ? BlockFlags{tile, two_step, infinities, false, integer_elements}
            : BlockFlags{kLoop == BlockLoop::tile,
                         kNvfp4,
                         kLoop == BlockLoop::nvfp4_infinities,
                         true,
                         !kNvfp4 && integer_elements,
                         !kNvfp4 && stochastic && IntegerCarryElements(lk),
                         kLoop == BlockLoop::nvfp4};
    const std::size_t lanes = hn::Lanes(d);  // a constant on fixed-width targets, not the captured variable
    const std::size_t l_block = block;
    const VF ts = hn::Set(df, tensor_scale);
    const DrawKey key = lk.key;
    const std::uint64_t l_first_index = first_index;
    const V l_iota = iota;
    const auto draw_at = [=](std::size_t at) {
      if constexpr (stochastic) return BlockDraws(d, key, l_first_index + at, l_iota);
      else return hn::Zero(d);
    };
    std::uint64_t l_nan_nonzero = 0, l_nan = 0, clamped = 0;
    constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(U);
    HWY_ALIGN float group_factor[kMaxLanes] = {}, group_dequant[kMaxLanes] = {};
    HWY_ALIGN U group_nan[kMaxLanes] = {};
    BlockParams group_ps[kMaxLanes];
    const std::size_t group = lanes * l_block;
    const bool flat = kLoop != BlockLoop::general && std::has_single_bit(l_block / lanes);
    const int shift = std::countr_zero(l_block / lanes);
    // One run of blocks per iteration: all of [begin, end) with `ps`, or (grouped) the next group, which
    // the flat loop may take whole.
    for (std::size_t g = begin;;) {
      std::size_t run_begin = begin, run_end = end;
      const BlockParams* run_ps = ps;
      if constexpr (kLoop != BlockLoop::tile) {
        if (grouped) {
          if (g + group > end) break;
          run_begin = g;
          run_end = g += group;
          if (run_end + kPrefetchAhead <= end)
            for (std::size_t o = 0; o < group; o += kLineFloats) hwy::Prefetch(x_in + run_begin + kPrefetchAhead + o);
          const V amax = block_amax != nullptr ? hn::LoadU(d, block_amax + run_begin / l_block)
                                                : GroupAmax(d, x_in + run_begin, l_block);
          clamped += GroupParams(d, rule, amax, group_factor, group_dequant, codes + run_begin / l_block, group_nan);
          if (flat && hn::AllTrue(d, hn::Eq(hn::Load(d, group_nan), hn::Zero(d)))) {
            // The group's draws: where its indices share their high word (all but one group in 2^32 / group),
            // the hash's low words step by `lanes` in a register, instead of BlockDraws' per-vector test and
            // index arithmetic (NVFP4 stochastic, AVX-512, 2026-11-28: the index lived on the stack, a store
            // and reload per vector). Which of the two is chosen once per group, outside the loop (tested per
            // vector, it kept the loop's invariants on the stack too).
            const std::uint64_t first_draw = l_first_index + run_begin;
            const bool one_word = (first_draw >> 32) == ((first_draw + group - 1) >> 32);
            // The group's tallies start from zero and join the run's after it: a tally live across GroupAmax
            // and GroupParams, where AVX2's 16 registers run out, stayed in memory throughout (a store and
            // reload of each per vector; perf, 2026-11-28).
            const auto flat_group = [&](auto one_word_c) {
              BlockTallies<D> gt = BlockTallies<D>::zero(d);
              V low_words = hn::Add(l_iota, hn::Set(d, static_cast<U>(first_draw)));
              const V high_term = hn::Set(d, draw_high_term(key, first_draw));
              for (std::size_t v = 0, j = run_begin; v < l_block; ++v, j += lanes) {
                V draw = hn::Zero(d);
                if constexpr (stochastic) {
                  if constexpr (decltype(one_word_c)::value) {
                    draw = Draws(d, key, low_words, high_term);
                    low_words = hn::Add(low_words, hn::Set(d, static_cast<U>(lanes)));
                  } else {
                    draw = draw_at(j);
                  }
                }
                VF element;
                const VF value = BlockVector<kMode>(d, lk, rounder, lc, hn::LoadU(df, x_in + j),
                                                    hn::Set(df, group_factor[v >> shift]),
                                                    hn::Set(df, group_dequant[v >> shift]), ts, flags, false, draw,
                                                    lanes, gt, element);
                if (x_out != nullptr) hn::StoreU(value, df, x_out + j);
                if (x_elements != nullptr) hn::StoreU(element, df, x_elements + j);
              }
              lt.add(gt);
            };
            if (!stochastic || one_word) flat_group(std::true_type{});
            else flat_group(std::false_type{});
            lt.lanes += group;
            continue;
          }
          for (std::size_t l = 0; l < lanes; ++l) {
            group_ps[l].nan = group_nan[l] != 0;
            group_ps[l].factor = group_factor[l];
            group_ps[l].dequant = group_dequant[l];
          }
          run_ps = group_ps;
        }
      }
      for (std::size_t first = run_begin, i = 0; first < run_end; first += l_block, ++i) {
        const std::size_t last = std::min(run_end, first + l_block);
        const BlockParams& p = run_ps[i];
        if (p.nan) {  // count before writing: `out` may be `in`
          for (std::size_t x = first; x < last; ++x)
            l_nan_nonzero += ((std::bit_cast<U>(x_in[x]) & 0x7FFFFFFFu) - 1u) < 0x7F7FFFFFu;
          if (x_out != nullptr) std::fill(x_out + first, x_out + last, std::numeric_limits<float>::quiet_NaN());
          if (x_elements != nullptr)
            std::fill(x_elements + first, x_elements + last, std::numeric_limits<float>::quiet_NaN());
          l_nan += last - first;
          continue;
        }
        const VF factor = hn::Set(df, p.factor), dequant = hn::Set(df, p.dequant);
        const bool zero_tile = p.zero_tile;
        lt.lanes += (last - first + lanes - 1) / lanes * lanes;
        VF element;
        std::size_t j = first;
        for (; j + lanes <= last; j += lanes) {
          const VF v = BlockVector<kMode>(d, lk, rounder, lc, hn::LoadU(df, x_in + j), factor, dequant, ts, flags,
                                          zero_tile, draw_at(j), lanes, lt, element);
          if (x_out != nullptr) hn::StoreU(v, df, x_out + j);
          if (x_elements != nullptr) hn::StoreU(element, df, x_elements + j);
        }
        if (j < last) {
          HWY_ALIGN float tail_out[HWY_MAX_BYTES / sizeof(float)];
          const VF v = BlockVector<kMode>(d, lk, rounder, lc, hn::Load(df, tail_in), factor, dequant, ts, flags,
                                          zero_tile, draw_at(j), last - j, lt, element);
          if (x_out != nullptr) {
            hn::Store(v, df, tail_out);
            std::memcpy(x_out + j, tail_out, (last - j) * sizeof(float));
          }
          if (x_elements != nullptr) {
            hn::Store(element, df, tail_out);
            std::memcpy(x_elements + j, tail_out, (last - j) * sizeof(float));
          }
        }
      }
      if (!grouped) break;
    }
    total.clamped += clamped;
    if constexpr (kLoop == BlockLoop::general) c = lc;  // the direct loops leave Counters alone
    tallies = lt;
    nan_nonzero += l_nan_nonzero;
    total.nan += l_nan;
  };
  // The NVFP4 loops take E2M1-like elements only (their flags say never integers): NVFP4's rule with integer
  // elements, which no preset or config builds, takes the general loop.
  const BlockLoop loop = !direct_elements || (two_step && integer_elements) ? BlockLoop::general
                         : tile                                              ? BlockLoop::tile
                         : two_step && (infinities || block_amax == nullptr) ? BlockLoop::nvfp4_infinities
                         : two_step                                          ? BlockLoop::nvfp4
                                                                             : BlockLoop::power_of_two;
  total.zeros_uncounted = loop == BlockLoop::nvfp4;
  const auto quantize_run = [&](std::size_t begin, std::size_t end, const BlockParams* ps, const float* tail_in,
                                bool grouped) {
    switch (loop) {
      case BlockLoop::power_of_two:
        return quantize_run_as(LoopTag<BlockLoop::power_of_two>{}, begin, end, ps, tail_in, grouped);
      case BlockLoop::nvfp4: return quantize_run_as(LoopTag<BlockLoop::nvfp4>{}, begin, end, ps, tail_in, grouped);
      case BlockLoop::nvfp4_infinities:
        return quantize_run_as(LoopTag<BlockLoop::nvfp4_infinities>{}, begin, end, ps, tail_in, grouped);
      case BlockLoop::tile: return quantize_run_as(LoopTag<BlockLoop::tile>{}, begin, end, ps, tail_in, false);
      case BlockLoop::general:
        return quantize_run_as(LoopTag<BlockLoop::general>{}, begin, end, ps, tail_in, grouped);
    }
  };
  std::size_t b = 0, begin = 0;
  // Whole groups of `lanes` blocks of whole vectors first (not for tiles, given scales or a NaN NVFP4 tensor).
  const bool grouped = given == nullptr && block % lanes == 0 && rule.kind != BlockKind::tile &&
                       !(rule.kind == BlockKind::nvfp4 && rule.tensor_nan);
  if (grouped) {
    const std::size_t groups_end = n / (lanes * block) * (lanes * block);
    if (groups_end > 0) quantize_run(0, groups_end, nullptr, nullptr, true);
    begin = groups_end;
    b = groups_end / block;
  }
  HWY_ALIGN float tail_in[HWY_MAX_BYTES / sizeof(float)] = {};
  for (; begin < n; ++b, begin += block) {
    const std::size_t end = std::min(n, begin + block);
    // The block's scale: given (a row's part of a 2-D tile), or from its largest magnitude.
    std::size_t j = begin;
    const std::size_t tail = (end - begin) % lanes;
    if (tail != 0) {  // the tail through a zero-padded buffer
      std::fill(tail_in, tail_in + lanes, 0.0f);
      std::memcpy(tail_in, in + end - tail, tail * sizeof(float));
    }
    BlockParams p;
    if (given != nullptr) {
      p = given[b];
    } else if (block_amax != nullptr) {
      p = block_params(rule, block_amax[b]);
      codes[b] = p.code;
      total.clamped += p.clamped;
    } else {
      V m = hn::Zero(d);
      for (; j + lanes <= end; j += lanes) m = hn::Max(m, hn::And(hn::BitCast(d, hn::LoadU(df, in + j)), magnitude));
      if (tail != 0) m = hn::Max(m, hn::And(hn::BitCast(d, hn::Load(df, tail_in)), magnitude));
      p = block_params(rule, hn::GetLane(hn::MaxOfLanes(d, m)));
      codes[b] = p.code;
      total.clamped += p.clamped;
    }
    quantize_run(begin, end, &p, tail_in, false);
  }
  HWY_ALIGN U lane_counts[2][HWY_MAX_BYTES / sizeof(U)] = {};
#if HWY_TARGET <= HWY_AVX3
  hn::Store(c.flushed, d, lane_counts[0]);
#endif
  hn::Store(c.overflow, d, lane_counts[1]);
  total.flushed += c.flushed_tally.total(d);
  total.saturated += c.overflow_tally.total(d) + tallies.saturated.total(d);
  for (std::size_t l = 0; l < lanes; ++l) {
    total.flushed += lane_counts[0][l];
    total.saturated += lane_counts[1][l];
  }
  total.nonzero += nan_nonzero + tallies.lanes - tallies.zeros.total(d);
  total.lost += tallies.lost.total(d);
}

void QuantizeBlocksFloat(const Kernel<std::uint32_t>& k, const BlockRule& rule, const BlockParams* given,
                         const float* in, float* out, float* elements, std::size_t n, std::size_t block,
                         std::uint64_t first_index, const std::uint32_t* block_amax, std::uint32_t* codes,
                         BlockKernelCounts& counts) {
  if (k.mode == RoundingMode::stochastic)
    QuantizeBlocksSpan<RoundingMode::stochastic>(k, rule, given, in, out, elements, n, block, first_index, block_amax,
                                                 codes, counts);
  else
    QuantizeBlocksSpan<RoundingMode::nearest_even>(k, rule, given, in, out, elements, n, block, first_index,
                                                   block_amax, codes, counts);
}

// The largest |x| of x[0, n) as binary32 bits (a NaN's are above 0x7F800000).
std::uint32_t AmaxBits(const float* x, std::size_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto magnitude = hn::Set(du, 0x7FFFFFFFu);
  const std::size_t lanes = hn::Lanes(df);
  auto m = hn::Zero(du), m1 = m, m2 = m, m3 = m;  // four independent chains
  const auto four_vectors = [&](std::size_t i) {
    m = hn::Max(m, hn::And(hn::BitCast(du, hn::LoadU(df, x + i)), magnitude));
    m1 = hn::Max(m1, hn::And(hn::BitCast(du, hn::LoadU(df, x + i + lanes)), magnitude));
    m2 = hn::Max(m2, hn::And(hn::BitCast(du, hn::LoadU(df, x + i + 2 * lanes)), magnitude));
    m3 = hn::Max(m3, hn::And(hn::BitCast(du, hn::LoadU(df, x + i + 3 * lanes)), magnitude));
  };
  // Every line fetched 16 KiB ahead: a pass that only reads is limited by how many lines are in flight, and
  // the hardware prefetcher alone kept too few (AVX-512 AMD EPYC VM, 2026-11-28, 64 MiB: about 6 -> 12 G
  // floats/s standalone; 2, 4, 8 and 32 KiB ahead were slower). NVFP4 reads its tensor once for this.
  constexpr std::size_t kAhead = 4096, kLineFloats = 64 / sizeof(float);
  std::size_t i = 0;
  for (; i + 4 * lanes + kAhead <= n; i += 4 * lanes) {
    for (std::size_t o = 0; o < 4 * lanes; o += kLineFloats) hwy::Prefetch(x + i + kAhead + o);
    four_vectors(i);
  }
  for (; i + 4 * lanes <= n; i += 4 * lanes) four_vectors(i);
  m = hn::Max(hn::Max(m, m1), hn::Max(m2, m3));
  for (; i + lanes <= n; i += lanes) m = hn::Max(m, hn::And(hn::BitCast(du, hn::LoadU(df, x + i)), magnitude));
  std::uint32_t result = hn::GetLane(hn::MaxOfLanes(du, m));
  for (; i < n; ++i) result = std::max(result, std::bit_cast<std::uint32_t>(x[i]) & 0x7FFFFFFFu);
  return result;
}

// AmaxBits, each block's amax into block_amax and the zeros' count: groups of
// `lanes` blocks through GroupAmax (one vector store per group), the rest
// block by block.
std::uint32_t BlockAmaxBits(const float* x, std::size_t n, std::size_t block, std::uint32_t* block_amax,
                           std::uint64_t& zeros) {
  const hn::ScalableTag<std::uint32_t> d;
  const std::size_t lanes = hn::Lanes(d);
  auto m = hn::Zero(d);
  zeros = 0;
  std::size_t i = 0, b = 0;
  if (block % lanes == 0) {
    // Prefetched as AmaxBits prefetches (a pass that only reads).
    constexpr std::size_t kAhead = 4096, kLineFloats = 64 / sizeof(float);
    const std::size_t group = lanes * block;
    // The zeros' lane counters (32 bits below AVX-512) are emptied every 2^28 values at most.
    const std::size_t groups_per_tally = std::max<std::size_t>(1, (std::size_t{1} << 28) / group);
    while (i + group <= n) {
      Tally<hn::ScalableTag<std::uint32_t>> zero_tally{hn::Zero(d)};
      for (std::size_t g = 0; g < groups_per_tally && i + group <= n; ++g, i += group, b += lanes) {
        if (i + group + kAhead <= n)
          for (std::size_t o = 0; o < group; o += kLineFloats) hwy::Prefetch(x + i + kAhead + o);
        const auto amax = GroupAmax(d, x + i, block, &zero_tally);
        hn::StoreU(amax, d, block_amax + b);
        m = hn::Max(m, amax);
      }
      zeros += zero_tally.total(d);
    }
  }
  std::uint32_t result = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < n; i += block, ++b) {
    const std::size_t end = std::min(n, i + block);
    block_amax[b] = AmaxBits(x + i, end - i);
    result = std::max(result, block_amax[b]);
    for (std::size_t j = i; j < end; ++j) zeros += (std::bit_cast<std::uint32_t>(x[j]) & 0x7FFFFFFFu) == 0;
  }
  return result;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mpsim::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mpsim::detail {

HWY_EXPORT(QuantizeFloat);
HWY_EXPORT(QuantizeDouble);
HWY_EXPORT(TargetName);
HWY_EXPORT(QuantizeBlocksFloat);
HWY_EXPORT(AmaxBits);
HWY_EXPORT(BlockAmaxBits);

void quantize_blocks_vector(const Kernel<std::uint32_t>& kernel, const BlockRule& rule, const BlockParams* given,
                            const float* in, float* out, float* elements, std::size_t n, std::size_t block,
                            std::uint64_t first_index, const std::uint32_t* block_amax, std::uint32_t* codes,
                            BlockKernelCounts& counts) {
  HWY_DYNAMIC_DISPATCH(QuantizeBlocksFloat)(kernel, rule, given, in, out, elements, n, block, first_index,
                                            block_amax, codes, counts);
}

std::uint32_t amax_bits(const float* x, std::size_t n) { return HWY_DYNAMIC_DISPATCH(AmaxBits)(x, n); }

std::uint32_t block_amax_bits(const float* x, std::size_t n, std::size_t block, std::uint32_t* block_amax,
                              std::uint64_t& zeros) {
  return HWY_DYNAMIC_DISPATCH(BlockAmaxBits)(x, n, block, block_amax, zeros);
}

QuantizeCounts quantize_vector(const Kernel<std::uint32_t>& kernel, const float* in, float* out, std::size_t n,
                               std::uint64_t first_index) {
  return HWY_DYNAMIC_DISPATCH(QuantizeFloat)(kernel, in, out, n, first_index);
}

QuantizeCounts quantize_vector(const Kernel<std::uint64_t>& kernel, const double* in, double* out, std::size_t n,
                               std::uint64_t first_index) {
  return HWY_DYNAMIC_DISPATCH(QuantizeDouble)(kernel, in, out, n, first_index);
}

const char* vector_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace mpsim::detail
#endif
