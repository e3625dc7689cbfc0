// Rounding a binary32 or binary64 value once into a format that fits in it,
// on the bit pattern: the one scalar rounding of stored values. The CPU's
// scalar quantize path (quantize.cpp) and the CUDA kernels (gpu/) both call
// round_pattern, so the CPU tests prove every bit the GPU rounds. The vector
// kernels (quantize_vector.cpp) are tested against it, and it against the
// exact generic rounding (rounding.cpp round_exact, Path::exact), MPFR and
// TestFloat.
//
// Integer arithmetic on the pattern only: the result never depends on the
// FPU's rounding mode, on flush-to-zero settings (nvcc -ftz, MXCSR) or on the
// CPU. No CUDA type and no host-only header; pattern_format.hpp builds a
// PatternFormat from an mpsim::Format on the host.
#pragma once

#include <cstdint>

#include "mpsim/emulation/host_device.hpp"

namespace mpsim {

// The storage's layout (IEEE 754-2019 §3.4), for U = uint32_t (binary32) or
// uint64_t (binary64).
template <class U>
struct StorageLayout {
  static constexpr int trailing_bits = sizeof(U) == 4 ? 23 : 52;
  static constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  static constexpr U magnitude = sign - 1;
  static constexpr U infinity = magnitude ^ ((U{1} << trailing_bits) - 1);
  // The quiet bit is the leading trailing-significand bit (§6.2.1).
  static constexpr U quiet_nan = infinity | (U{1} << (trailing_bits - 1));
};

// A format that fits in the storage, with what rounding needs worked out once
// on the host as storage patterns (pattern_format.hpp). Passed to kernels by value.
template <class U>
struct PatternFormat {
  int exponent_bits;
  int mantissa_bits;
  bool flush_to_zero;  // Subnormals::flush_to_zero
  bool saturate;       // Overflow::saturate
  bool has_infinity;   // false for Specials::nan_only and none, and for formats with no mantissa bits
  bool has_nan;        // false for Specials::none (OCP FP6/FP4): a NaN becomes +largest_finite
  U shift;                // storage trailing bits - mantissa_bits: the quantum of a normal binade, in pattern units
  U min_normal_exponent;  // the format's emin as a biased exponent of the storage (>= 1)
  U smallest_normal;      // storage patterns of format values
  U smallest_subnormal;   // the smallest normal when flushing
  U largest_finite;
  U nan_keep;  // a NaN result is (input & nan_keep) | the storage's quiet NaN
};

// mpsim::RoundingMode's values (pattern_format.hpp checks that they agree;
// device code does not include rounding.hpp).
namespace pattern_mode {
inline constexpr std::uint8_t nearest_even = 0, nearest_away = 1, toward_zero = 2, toward_positive = 3,
                              toward_negative = 4, odd = 5, stochastic = 6;
}

struct PatternRounding {
  std::uint8_t mode;         // a pattern_mode value
  std::uint8_t random_bits;  // 1..32: how many leading draw bits stochastic rounding uses
};

// A rounded value (V: the storage pattern U from round_pattern, or the float
// it encodes) and what QuantizeCounts counts for it (quantize.hpp).
template <class V>
struct RoundedValue {
  V value;
  bool inexact;          // differs from the input; every overflow is inexact
  bool flushed_to_zero;  // input finite and nonzero, result +-0
  bool subnormal;        // result is a nonzero subnormal of the format
  bool overflow;         // IEEE 754-2019 §7.4 overflow, or an infinity into a format without one
  bool nan;              // NaN input (a format with no NaN makes it +largest finite), or overflow to NaN
                         // in a format with NaN but no infinity
};

namespace pattern_detail {

// Stochastic rounding's decision, as rounding.cpp's round_at: the remainder
// below the quantum 2^s as a 0.32 fixed-point fraction of it, cut to the
// leading `random_bits` bits, rounds up when adding the draw's leading bits
// carries out of 32 bits.
template <class U>
MPSIM_HOST_DEVICE inline bool stochastic_up(U rest, U s, int random_bits, std::uint32_t draw) {
  std::uint32_t fraction = 0;
  if (s <= 32) fraction = static_cast<std::uint32_t>(rest << (32 - s));  // rest < 2^s: no bit lost
  else if (s - 32 < 8 * sizeof(U)) fraction = static_cast<std::uint32_t>(rest >> (s - 32));
  const std::uint32_t keep = ~std::uint32_t{0} << (32 - random_bits);
  fraction &= keep;
  return static_cast<std::uint32_t>(fraction + (draw & keep)) < fraction;  // wrapped around: a carry out
}

// Rounds a finite nonzero magnitude (pattern a) to the format; the result is a
// storage pattern, possibly above the largest finite value (overflow).
//
// With T trailing bits and bias B, a = (e << T) | t is (2^T + t) * 2^(e-B-T)
// for e >= 1 and t * 2^(1-B-T) for e = 0. With eff = max(e, 1),
// M = a - ((eff - 1) << T) < 2^(T+1) is the significand and
// |x| = M * 2^(eff-B-T). The format's quantum there is 2^(eff-B-T+s):
// s = shift in a normal binade, larger below the format's smallest normal
// (gradual underflow: a fixed quantum 2^(emin - m)). Rounding M to a multiple
// of 2^s and adding (eff - 1) << T back gives the pattern; a carry out of the
// significand lands in the exponent field, the next binade.
template <class U>
MPSIM_HOST_DEVICE inline U round_magnitude(U a, bool negative, const PatternFormat<U>& f, PatternRounding r,
                                           std::uint32_t draw) {
  constexpr int T = StorageLayout<U>::trailing_bits;
  const U e = a >> T;
  const U eff = e > 1 ? e : 1;
  const U significand = a - ((eff - 1) << T);
  U s = f.shift;
  if (!f.flush_to_zero) {
    if (eff < f.min_normal_exponent) s += f.min_normal_exponent - eff;
  } else if (e == 0 && s > 0) {
    // Flushing decides tininess after rounding to the format's precision with
    // an unbounded exponent (IEEE 754-2019 §7.5). Of the storage's subnormals
    // only those in its top subnormal binade can round up to a normal (when
    // the format's emin is the storage's), and their quantum is one binade
    // finer; smaller ones flush anyway.
    s -= 1;
  }
  // Beyond T + 2 the quotient is 0 and the remainder below half: the same decisions.
  const U clamped = s < T + 2 ? s : U{T + 2};
  U q = significand >> clamped;
  const U rest = significand & ((U{1} << clamped) - 1);
  if (rest != 0) {
    const U half = U{1} << (clamped - 1);
    bool up = false;
    switch (r.mode) {
      case pattern_mode::nearest_even: up = rest > half || (rest == half && (q & 1) != 0); break;
      case pattern_mode::nearest_away: up = rest >= half; break;
      case pattern_mode::toward_positive: up = !negative; break;
      case pattern_mode::toward_negative: up = negative; break;
      case pattern_mode::odd: q |= 1; break;  // truncate, then set the last bit: inexact results are odd
      case pattern_mode::stochastic: up = stochastic_up<U>(rest, s, r.random_bits, draw); break;
      default: break;  // toward_zero
    }
    q += up ? 1 : 0;
  }
  // Below one quantum of the storage's pattern (s > T) the quantum is the
  // format's smallest subnormal, and q is 0 or 1.
  U magnitude = s > U{T} ? (q != 0 ? f.smallest_subnormal : U{0}) : ((eff - 1) << T) + (q << s);
  if (f.flush_to_zero && magnitude < f.smallest_normal) magnitude = 0;
  return magnitude;
}

// What an overflow becomes (IEEE 754-2019 §7.4): infinity in the modes that
// do not point toward zero, else the largest finite value; a format without
// infinity gets NaN there, a saturating format always the largest finite.
template <class U>
MPSIM_HOST_DEVICE inline U overflow_result(const PatternFormat<U>& f, std::uint8_t mode, U sign) {
  bool to_infinity = true;
  if (mode == pattern_mode::toward_zero || mode == pattern_mode::odd) to_infinity = false;
  if (mode == pattern_mode::toward_positive) to_infinity = sign == 0;
  if (mode == pattern_mode::toward_negative) to_infinity = sign != 0;
  if (f.saturate || !to_infinity) return sign | f.largest_finite;
  return sign | (f.has_infinity ? StorageLayout<U>::infinity : StorageLayout<U>::quiet_nan);
}

}  // namespace pattern_detail

// Rounds the stored value with pattern `bits` once into the format. `draw` is
// the element's 32-bit random word (random_draw); only stochastic rounding
// reads it. NaNs come out quiet with the input's sign and as many leading
// payload bits as the format holds (none without infinities), as the
// emulator's encodings store them.
template <class U>
MPSIM_HOST_DEVICE inline RoundedValue<U> round_pattern(U bits, const PatternFormat<U>& f, PatternRounding r,
                                                         std::uint32_t draw) {
  using L = StorageLayout<U>;
  const U sign = bits & L::sign;
  const U a = bits ^ sign;
  RoundedValue<U> out{bits, false, false, false, false, false};
  if (a > L::infinity) {
    out.value = f.has_nan ? (bits & f.nan_keep) | L::quiet_nan : f.largest_finite;
    out.nan = true;
    return out;
  }
  if (a == 0 || (a == L::infinity && f.has_infinity)) return out;  // zeros and infinities stay
  const bool infinite = a == L::infinity;  // into a format without infinity: an overflow
  const U magnitude = infinite ? a : pattern_detail::round_magnitude<U>(a, sign != 0, f, r, draw);
  out.overflow = magnitude > f.largest_finite;
  out.value = out.overflow ? pattern_detail::overflow_result<U>(f, r.mode, sign) : sign | magnitude;
  const U result_magnitude = out.value ^ sign;
  out.inexact = out.overflow || out.value != bits;
  out.flushed_to_zero = result_magnitude == 0;
  out.subnormal = result_magnitude != 0 && result_magnitude < f.smallest_normal;
  out.nan = result_magnitude > L::infinity;
  return out;
}

}  // namespace mpsim
