// Internal: exact values as integers, and the one rounding routine every
// operation ends in.
#pragma once

#include <cstdint>

#include "mpsim/emulation/rounding.hpp"

namespace mpsim::detail {

using u128 = unsigned __int128;

// value = (significand + epsilon) * 2^exponent, where epsilon is some number
// strictly between 0 and 1 when `sticky` is set (bits lost below the unit).
// Callers keep at least precision+2 bits above the unit, so the sticky bit
// only ever decides direction, never a tie.
struct Exact {
  bool negative = false;
  int exponent = 0;
  u128 significand = 0;
  bool sticky = false;
};

enum class Kind : std::uint8_t { zero, finite, infinite, nan };

// An encoding taken apart: value = significand * 2^exponent for finite values.
struct Decoded {
  Kind kind = Kind::zero;
  bool negative = false;
  int exponent = 0;
  std::uint64_t significand = 0;
  bool signaling = false;  // NaN only
  std::uint64_t payload = 0;  // NaN only: mantissa bits below the quiet bit
};

Decoded decode(const Format& format, Bits bits);
Decoded decode_binary64(double value);
Decoded decode_binary32(float value);

// Rounds an exact finite nonzero-or-zero value into the format, once.
Rounded round_exact(const Format& format, Rounding rounding, const Exact& value, std::uint32_t draw);

// The encoding of an infinite result: infinity, or (no infinity in the
// format) NaN or the largest finite value as the overflow policy says.
Bits encode_infinite(const Format& format, bool negative);
// What an overflow becomes in this mode (IEEE 754 §7.4, or saturation).
Bits overflow_result(const Format& format, RoundingMode mode, bool negative);
Bits encode_zero(const Format& format, bool negative);
// A quiet NaN carrying the sign and leading payload bits of a decoded NaN.
Bits encode_nan(const Format& format, bool negative, std::uint64_t payload, int payload_bits);
Bits default_nan(const Format& format);

inline int bit_width128(u128 x) {
  const auto high = static_cast<std::uint64_t>(x >> 64);
  if (high != 0) return 128 - __builtin_clzll(high);
  const auto low = static_cast<std::uint64_t>(x);
  return low == 0 ? 0 : 64 - __builtin_clzll(low);
}

}  // namespace mpsim::detail
