// Rounding of binary64 values for the kernels that must round an exact sum
// once: apply_update (w + u) and the GEMM that rounds after every addition
// (acc + a*b). Both backends round these sums to odd in binary64
// (numerics.hpp add_round_to_odd), then the CPU quantizes the double once
// (mpsim::quantize on a double array); rounding the double through a float
// would round twice, so this is the emulator's round_pattern on the binary64
// pattern (pattern_rounding.hpp), with the format widened to binary64 and the
// result narrowed back, exactly, to binary32.
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

// The format as binary64 patterns: the same values, widened exactly.
MPSIM_HOST_DEVICE inline PatternFormat<std::uint64_t> widen_format(const DeviceFormat& f) {
  using namespace detail;
  PatternFormat<std::uint64_t> w{};
  w.exponent_bits = f.exponent_bits;
  w.mantissa_bits = f.mantissa_bits;
  w.flush_to_zero = f.flush_to_zero;
  w.saturate = f.saturate;
  w.has_infinity = f.has_infinity;
  w.has_nan = f.has_nan;
  w.shift = std::uint64_t{f.shift} + (trailing_bits64 - trailing_bits);
  w.min_normal_exponent = std::uint64_t{f.min_normal_exponent} + bias_difference;
  w.smallest_normal = widen_magnitude(f.smallest_normal);
  w.smallest_subnormal = widen_magnitude(f.smallest_subnormal);
  w.largest_finite = widen_magnitude(f.largest_finite);
  w.nan_keep = f.has_infinity ? ~((std::uint64_t{1} << w.shift) - 1) : sign_bit64;
  return w;
}

// Rounds the binary64 value x once into the format (which fits in binary32)
// and returns the format's value as a float, with what QuantizeCounts counts
// for it: what mpsim::quantize does to an element of a double array (the same
// round_pattern, on the binary64 pattern), then the CPU backend's
// static_cast<float> (exact for a format value; a NaN keeps the quiet bit and
// the payload bits the format holds, as x86's conversion does).
// `wide` is widen_format of the format: kernels widen it once, outside their loops.
MPSIM_HOST_DEVICE inline RoundedFloat round_double(double x, const PatternFormat<std::uint64_t>& wide,
                                                   DeviceRounding r, std::uint32_t draw) {
  using namespace detail;
  const RoundedValue<std::uint64_t> p = round_pattern<std::uint64_t>(bits_of(x), wide, r, draw);
  const std::uint64_t sign = p.value & sign_bit64;
  const std::uint32_t sign32 = sign != 0 ? sign_bit : 0u;
  return {float_of(sign32 | narrow_magnitude(p.value ^ sign)), p.inexact, p.flushed_to_zero, p.subnormal, p.overflow,
          p.nan};
}

MPSIM_HOST_DEVICE inline RoundedFloat round_double(double x, DeviceFormat f, DeviceRounding r, std::uint32_t draw) {
  return round_double(x, widen_format(f), r, draw);
}

}  // namespace mpsim::gpu
