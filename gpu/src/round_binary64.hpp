// Rounding of binary64 values for the kernels that must round an exact sum
// once: apply_update (w + u) and the GEMM that rounds after every addition
// (acc + a*b). Both backends round these sums to odd in binary64
// (numerics.hpp add_round_to_odd), then the CPU quantizes the double once
// (mpsim::quantize on a double array); rounding the double through a float
// would round twice, so this is round_float (device_rounding.hpp) redone on
// the binary64 pattern, bit for bit the emulator's round_exact for binary64
// inputs, NaN payloads included.
//
// Integer arithmetic on the pattern only, like device_rounding.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "mpsim/core/numerics.hpp"
#include "mpsim/gpu/device_rounding.hpp"

namespace mpsim::gpu {
namespace detail {

// binary64's layout (IEEE 754-2019 §3.4).
inline constexpr std::uint64_t sign_bit64 = 0x8000000000000000ull;
inline constexpr std::uint64_t infinity_bits64 = 0x7FF0000000000000ull;
inline constexpr int trailing_bits64 = 52;
// binary64's exponent bias minus binary32's: a binary32 exponent field plus
// this is the binary64 field of the same binade.
inline constexpr std::uint32_t bias_difference = 1023 - 127;

MPSIM_HOST_DEVICE inline std::uint64_t bits_of(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MPSIM_HOST_DEVICE inline double double_of(std::uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Index of the highest set bit of a nonzero 32-bit word.
MPSIM_HOST_DEVICE inline int top_bit(std::uint32_t x) {
#ifdef __CUDA_ARCH__
  return 31 - __clz(static_cast<int>(x));
#else
  return 31 - __builtin_clz(x);
#endif
}

// The binary64 pattern of a binary32 magnitude pattern (finite or infinite):
// the same value, widened exactly, without the FPU (so no flush-to-zero
// setting can touch a binary32 subnormal).
MPSIM_HOST_DEVICE inline std::uint64_t widen_magnitude(std::uint32_t a) {
  const std::uint32_t e = a >> trailing_bits, t = a & 0x7FFFFFu;
  if (e == 0xFF) return infinity_bits64 | (std::uint64_t{t} << 29);
  if (e != 0) return (std::uint64_t{e + bias_difference} << trailing_bits64) | (std::uint64_t{t} << 29);
  if (t == 0) return 0;
  // t * 2^-149 with its top bit at b: 2^(b - 149) * (t / 2^b).
  const int b = top_bit(t);
  const std::uint64_t fraction = (std::uint64_t{t} << (52 - b)) & ((std::uint64_t{1} << 52) - 1);
  return (static_cast<std::uint64_t>(b + 874) << trailing_bits64) | fraction;
}

// The binary32 pattern of a binary64 magnitude pattern whose value is
// exactly representable in binary32 (a value of a format that fits in it).
MPSIM_HOST_DEVICE inline std::uint32_t narrow_magnitude(std::uint64_t a) {
  const auto e = static_cast<std::uint32_t>(a >> trailing_bits64);
  const std::uint64_t t = a & ((std::uint64_t{1} << 52) - 1);
  if (e == 0x7FF) return infinity_bits | static_cast<std::uint32_t>(t >> 29);
  if (e == 0) return 0;  // binary64 subnormals are below binary32's range: only 0 is representable
  if (e > bias_difference) return ((e - bias_difference) << trailing_bits) | static_cast<std::uint32_t>(t >> 29);
  // A binary32 subnormal: (2^52 + t) * 2^(e - 1075) = s * 2^-149.
  const std::uint32_t shift = 926 - e;  // >= 30 for e <= 896
  return shift < 64 ? static_cast<std::uint32_t>(((std::uint64_t{1} << 52) | t) >> shift) : 0u;
}

}  // namespace detail

// x + y rounded to binary64 by round-to-odd: core's rule (numerics.hpp),
// which the CPU backend calls too.
using core::add_round_to_odd;

// Rounds the binary64 value x once into the format (which fits in binary32)
// and returns the format's value as a float, with what QuantizeCounts counts
// for it: what mpsim::quantize does to an element of a double array, then the
// CPU backend's static_cast<float> (exact for a format value; a NaN keeps the
// quiet bit and the payload bits the format holds, as x86's conversion does).
MPSIM_HOST_DEVICE inline RoundedFloat round_double(double x, DeviceFormat f, DeviceRounding r, std::uint32_t draw) {
  using namespace detail;
  const std::uint64_t bits = bits_of(x);
  const std::uint64_t sign = bits & sign_bit64;
  const std::uint32_t sign32 = sign != 0 ? sign_bit : 0u;
  const std::uint64_t a = bits ^ sign;
  RoundedFloat out{0.0f, false, false, false, false, false};
  if (a > infinity_bits64) {
    // The leading 23 bits of the payload (quiet bit first), then the format's NaN.
    const std::uint32_t wide = sign32 | infinity_bits | static_cast<std::uint32_t>((a >> 29) & 0x7FFFFFu);
    out.value = float_of((wide & f.nan_keep) | quiet_nan_bits);
    out.nan = true;
    return out;
  }
  if (a == 0) {
    out.value = float_of(sign32);
    return out;
  }
  if (a == infinity_bits64 && f.has_infinity) {
    out.value = float_of(sign32 | infinity_bits);
    return out;
  }
  const std::uint64_t largest = widen_magnitude(f.largest_finite);
  std::uint64_t magnitude = a;  // an infinity into a format without one: an overflow
  if (a != infinity_bits64) {
    // As round_magnitude, on the 53-bit significand: |x| = M * 2^(eff - 1075).
    const auto e = static_cast<std::uint32_t>(a >> trailing_bits64);
    const std::uint32_t eff = e > 1 ? e : 1;
    const std::uint64_t significand = a - (static_cast<std::uint64_t>(eff - 1) << trailing_bits64);
    std::uint32_t s = f.shift + 29;  // 52 - mantissa_bits
    const std::uint32_t min_normal = f.min_normal_exponent + bias_difference;
    if (!f.flush_to_zero) {
      if (eff < min_normal) s += min_normal - eff;  // below the format's normals: its subnormal quantum
    }
    // Flushing: binary64 subnormals lie far below every such format's normals
    // (tiny, flushed below); a normal rounds at the format's precision with an
    // unbounded exponent, and flushes when still below its smallest normal.
    if (f.flush_to_zero && e == 0) {
      magnitude = 0;
    } else {
      // Beyond 54 the quotient is 0 and the remainder below half: the same decisions.
      const std::uint32_t clamped = s < 54 ? s : 54;
      std::uint64_t q = significand >> clamped;
      const std::uint64_t rest = significand & ((std::uint64_t{1} << clamped) - 1);
      if (rest != 0) {
        const std::uint64_t half = std::uint64_t{1} << (clamped - 1);
        bool up = false;
        switch (r.mode) {
          case device_mode::nearest_even: up = rest > half || (rest == half && (q & 1) != 0); break;
          case device_mode::nearest_away: up = rest >= half; break;
          case device_mode::toward_positive: up = sign == 0; break;
          case device_mode::toward_negative: up = sign != 0; break;
          case device_mode::odd: q |= 1; break;
          case device_mode::stochastic: {
            // rounding.cpp round_at: the remainder as a 0.32 fraction of the
            // quantum 2^s (s >= 29 here), cut to random_bits bits.
            std::uint32_t fraction = 0;
            if (s <= 32) fraction = static_cast<std::uint32_t>(rest << (32 - s));
            else if (s - 32 < 64) fraction = static_cast<std::uint32_t>(rest >> (s - 32));
            const std::uint32_t keep = ~std::uint32_t{0} << (32 - r.random_bits);
            fraction &= keep;
            up = fraction + (draw & keep) < fraction;  // a carry out of 32 bits
            break;
          }
          default: break;  // toward_zero
        }
        q += up ? 1 : 0;
      }
      // Above 52 the quantum is the format's smallest subnormal and q is 0 or 1.
      magnitude = s > 52 ? (q != 0 ? widen_magnitude(f.smallest_subnormal) : 0)
                         : (static_cast<std::uint64_t>(eff - 1) << trailing_bits64) + (q << s);
      if (f.flush_to_zero && magnitude < widen_magnitude(f.smallest_normal)) magnitude = 0;
    }
  }
  out.overflow = magnitude > largest;
  const std::uint32_t result =
      out.overflow ? overflow_result(f, r.mode, sign32) : sign32 | narrow_magnitude(magnitude);
  const std::uint32_t result_magnitude = result ^ sign32;
  out.value = float_of(result);
  out.inexact = out.overflow || magnitude != a;
  out.flushed_to_zero = result_magnitude == 0;
  out.subnormal = result_magnitude != 0 && result_magnitude < f.smallest_normal;
  out.nan = result_magnitude > infinity_bits;
  return out;
}

}  // namespace mpsim::gpu
