// The emulator's float rounding for CUDA kernels and host code alike: rounds a
// binary32 value once into a format that fits in binary32 (fits_in_float) and
// reports what QuantizeCounts counts for it. A port of the scalar reference
// (emulation/src/rounding.cpp round_exact, quantize.cpp quantize_scalar), bit
// for bit, NaN payloads included; tests/gpu/test_device_rounding.cpp proves it
// on the host against mpsim::quantize.
//
// Integer arithmetic on the binary32 pattern only: the result never depends on
// the FPU's rounding mode, on flush-to-zero settings (nvcc -ftz) or on double
// support. No CUDA type and no host-only header: the host helpers that build a
// DeviceFormat from an mpsim::Format live in device_format.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "mpsim/emulation/host_device.hpp"
#include "mpsim/emulation/random_draw.hpp"

namespace mpsim::gpu {

// A format that fits in binary32, with what rounding needs worked out once on
// the host as binary32 patterns (make_device_format). Passed to kernels by value.
struct DeviceFormat {
  int exponent_bits;
  int mantissa_bits;
  bool flush_to_zero;  // Subnormals::flush_to_zero
  bool saturate;       // Overflow::saturate
  bool has_infinity;   // false for Specials::nan_only and for formats with no mantissa bits
  std::uint32_t shift;                // 23 - mantissa_bits: the quantum of a normal binade, in pattern units
  std::uint32_t min_normal_exponent;  // the format's emin as a biased binary32 exponent (>= 1)
  std::uint32_t smallest_normal;      // binary32 patterns of format values
  std::uint32_t smallest_subnormal;   // the smallest normal when flushing
  std::uint32_t largest_finite;
  std::uint32_t nan_keep;  // a NaN result is (input & nan_keep) | quiet NaN
};

// mpsim::RoundingMode's values (device code does not include the emulator's
// headers; device_format.hpp checks that they agree).
namespace device_mode {
inline constexpr std::uint8_t nearest_even = 0, nearest_away = 1, toward_zero = 2, toward_positive = 3,
                              toward_negative = 4, odd = 5, stochastic = 6;
}

struct DeviceRounding {
  std::uint8_t mode;         // a device_mode value
  std::uint8_t random_bits;  // 1..32: how many leading draw bits stochastic rounding uses
};

// A rounded value and what QuantizeCounts counts for it (quantize.hpp).
struct RoundedFloat {
  float value;
  bool inexact;          // value differs from x; every overflow is inexact
  bool flushed_to_zero;  // x finite and nonzero, value +-0
  bool subnormal;        // value is a nonzero subnormal of the format
  bool overflow;         // IEEE 754-2019 §7.4 overflow, or an infinity into a format without one
  bool nan;              // value is NaN (NaN input, or overflow to NaN in a format without infinity)
};

namespace detail {

// binary32's layout (IEEE 754-2019 §3.4).
inline constexpr std::uint32_t sign_bit = 0x80000000u;
inline constexpr std::uint32_t infinity_bits = 0x7F800000u;
inline constexpr std::uint32_t quiet_nan_bits = 0x7FC00000u;  // the quiet bit is the leading trailing-significand bit (§6.2.1)
inline constexpr int trailing_bits = 23;

MPSIM_HOST_DEVICE inline std::uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MPSIM_HOST_DEVICE inline float float_of(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Stochastic rounding's decision, as rounding.cpp's round_at: the remainder
// below the quantum 2^s as a 0.32 fixed-point fraction of it, cut to the
// leading `random_bits` bits, rounds up when adding the draw's leading bits
// carries out of 32 bits.
MPSIM_HOST_DEVICE inline bool stochastic_up(std::uint32_t rest, std::uint32_t s, int random_bits,
                                            std::uint32_t draw) {
  std::uint32_t fraction = 0;
  if (s <= 32) fraction = rest << (32 - s);  // rest < 2^min(s, 24): no bit lost
  else if (s < 64) fraction = rest >> (s - 32);
  const std::uint32_t keep = ~std::uint32_t{0} << (32 - random_bits);
  fraction &= keep;
  return fraction + (draw & keep) < fraction;  // wrapped around: a carry out of 32 bits
}

// Rounds a finite nonzero magnitude (pattern a) to the format; the result is
// a binary32 pattern, possibly above the largest finite value (overflow).
//
// a = (e << 23) | t is (2^23 + t) * 2^(e - 150) for e >= 1 and t * 2^-149 for
// e = 0. With eff = max(e, 1), M = a - ((eff - 1) << 23) < 2^24 is the
// significand and |x| = M * 2^(eff - 150). The format's quantum there is
// 2^(eff - 150 + s): s = shift in a normal binade, larger below the format's
// smallest normal (gradual underflow: a fixed quantum 2^(emin - m)). Rounding
// M to a multiple of 2^s and adding (eff - 1) << 23 back gives the pattern; a
// carry out of the significand lands in the exponent field, the next binade.
MPSIM_HOST_DEVICE inline std::uint32_t round_magnitude(std::uint32_t a, bool negative, const DeviceFormat& f,
                                                       DeviceRounding r, std::uint32_t draw) {
  const std::uint32_t e = a >> trailing_bits;
  const std::uint32_t eff = e > 1 ? e : 1;
  const std::uint32_t significand = a - ((eff - 1) << trailing_bits);
  std::uint32_t s = f.shift;
  if (!f.flush_to_zero) {
    if (eff < f.min_normal_exponent) s += f.min_normal_exponent - eff;
  } else if (e == 0 && s > 0) {
    // Flushing decides tininess after rounding to the format's precision with
    // an unbounded exponent (IEEE 754-2019 §7.5). Of binary32's subnormals only
    // those in [2^-127, 2^-126) can round up to a normal (2^-126, when emin is
    // -126), and their quantum is one binade finer; smaller ones flush anyway.
    s -= 1;
  }
  // Beyond 25 the quotient is 0 and the remainder below half: the same decisions.
  const std::uint32_t clamped = s < 25 ? s : 25;
  std::uint32_t q = significand >> clamped;
  const std::uint32_t rest = significand & ((std::uint32_t{1} << clamped) - 1);
  if (rest != 0) {
    const std::uint32_t half = std::uint32_t{1} << (clamped - 1);
    bool up = false;
    switch (r.mode) {
      case device_mode::nearest_even: up = rest > half || (rest == half && (q & 1) != 0); break;
      case device_mode::nearest_away: up = rest >= half; break;
      case device_mode::toward_positive: up = !negative; break;
      case device_mode::toward_negative: up = negative; break;
      case device_mode::odd: q |= 1; break;  // truncate, then set the last bit: inexact results are odd
      case device_mode::stochastic: up = stochastic_up(rest, s, r.random_bits, draw); break;
      default: break;  // toward_zero
    }
    q += up ? 1 : 0;
  }
  // Below one quantum of binary32's pattern (s > 23) the quantum is the
  // format's smallest subnormal, and q is 0 or 1.
  std::uint32_t magnitude =
      s > 23 ? (q != 0 ? f.smallest_subnormal : 0) : ((eff - 1) << trailing_bits) + (q << s);
  if (f.flush_to_zero && magnitude < f.smallest_normal) magnitude = 0;
  return magnitude;
}

// What an overflow becomes (IEEE 754-2019 §7.4): infinity in the modes that
// do not point toward zero, else the largest finite value; a format without
// infinity gets NaN there, a saturating format always the largest finite.
MPSIM_HOST_DEVICE inline std::uint32_t overflow_result(const DeviceFormat& f, std::uint8_t mode, std::uint32_t sign) {
  bool to_infinity = true;
  if (mode == device_mode::toward_zero || mode == device_mode::odd) to_infinity = false;
  if (mode == device_mode::toward_positive) to_infinity = sign == 0;
  if (mode == device_mode::toward_negative) to_infinity = sign != 0;
  if (f.saturate || !to_infinity) return sign | f.largest_finite;
  return sign | (f.has_infinity ? infinity_bits : quiet_nan_bits);
}

}  // namespace detail

// Rounds x once into the format and returns the format's value as a float.
// `draw` is the element's 32-bit random word (device_random_draw); only
// stochastic rounding reads it. NaNs come out quiet with x's sign and as many
// leading payload bits as the format holds (none without infinities), as the
// emulator stores them.
MPSIM_HOST_DEVICE inline RoundedFloat round_float(float x, DeviceFormat f, DeviceRounding r, std::uint32_t draw) {
  using namespace detail;
  const std::uint32_t bits = bits_of(x);
  const std::uint32_t sign = bits & sign_bit;
  const std::uint32_t a = bits ^ sign;
  RoundedFloat out{x, false, false, false, false, false};
  if (a > infinity_bits) {
    out.value = float_of((bits & f.nan_keep) | quiet_nan_bits);
    out.nan = true;
    return out;
  }
  if (a == 0 || (a == infinity_bits && f.has_infinity)) return out;  // zeros and infinities stay
  const bool infinite = a == infinity_bits;  // into a format without infinity: an overflow
  const std::uint32_t magnitude = infinite ? a : round_magnitude(a, sign != 0, f, r, draw);
  out.overflow = magnitude > f.largest_finite;
  const std::uint32_t result = out.overflow ? overflow_result(f, r.mode, sign) : sign | magnitude;
  const std::uint32_t result_magnitude = result ^ sign;
  out.value = float_of(result);
  out.inexact = out.overflow || result != bits;
  out.flushed_to_zero = result_magnitude == 0;
  out.subnormal = result_magnitude != 0 && result_magnitude < f.smallest_normal;
  out.nan = result_magnitude > infinity_bits;
  return out;
}

// mpsim::random_draw (random_draw.hpp, the emulator's own) with the DrawKey's two words.
MPSIM_HOST_DEVICE inline std::uint32_t device_random_draw(std::uint32_t key_low, std::uint32_t key_high,
                                                          std::uint64_t index) {
  return random_draw(DrawKey{key_low, key_high}, index);
}

}  // namespace mpsim::gpu
